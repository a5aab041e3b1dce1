"""benchmarks/exact_metrics_equal.py: the check behind "the default suite's exact metrics unchanged to the byte"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "reports" / "sample" / "results.json"


def _run(old: Path, new: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "exact_metrics_equal.py"), str(old), str(new)],
                          capture_output=True, text=True, cwd=ROOT)


def test_a_run_against_itself_differs_nowhere_and_one_changed_byte_is_named(tmp_path) -> None:
    same = _run(SAMPLE, SAMPLE)
    assert same.returncode == 0 and " 0 differ" in same.stdout
    data = json.loads(SAMPLE.read_text())
    row = next(r for r in data["results"] if isinstance(r.get("metrics", {}).get("peak_bytes"), int))
    row["metrics"]["peak_bytes"] += 1
    changed = tmp_path / "results.json"
    changed.write_text(json.dumps(data))
    out = _run(SAMPLE, changed)
    assert out.returncode == 1 and f"{row['suite']}::{row['scenario']}: peak_bytes:" in out.stdout and " 1 differ" in out.stdout
