"""The YAML example of docs/checkpoints.md ("Axes and presets") loads as written and names what its comments say."""

from __future__ import annotations

import re
from pathlib import Path

from pytest_flashckpt.config.suites import load_suite

DOC = Path(__file__).resolve().parents[2] / "docs" / "checkpoints.md"


def test_the_axes_example_names_what_its_comments_say(tmp_path) -> None:
    section = DOC.read_text(encoding="utf-8").split("## Axes and presets", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, flags=re.S).group(1)
    said = dict(re.findall(r"- name: (\S+) +#[^\n]*\"([^\"\n]+)\"", block))
    path = tmp_path / "axes.yaml"
    path.write_text(block, encoding="utf-8")
    shown = {s.name: s.save.strategy for s in load_suite(str(path)).scenarios}
    assert len(said) == 3 and shown == said
