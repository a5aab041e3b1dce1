"""``flashckpt run``: a suite measured without pytest writes the results.json schema a pytest suite run writes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pytest_flashckpt.cli import main
from pytest_flashckpt.core.result import SCHEMA_VERSION, RunRecord
from pytest_flashckpt.config.record_file import read_record

SUITE = """\
name: clirun
defaults: {model: tiny, batch_size: 1, seq_len: 32, attention: eager, measure: [memory]}
scenarios:
  - name: ref
"""


def test_run_writes_results_and_report(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(SUITE, encoding="utf-8")
    assert main(["run", "--suite", "s.yaml", "--report", "out", "--device", "cpu"]) == 0
    data = json.loads((tmp_path / "out" / "results.json").read_text(encoding="utf-8"))
    assert set(data) == {f.name for f in dataclasses.fields(RunRecord)} and data["schema_version"] == SCHEMA_VERSION
    record = read_record(tmp_path / "out" / "results.json")
    assert [(r.id, r.status) for r in record.results] == [("clirun::ref", "measured")]
    assert record.results[0].metrics["peak_bytes"] > 0 and record.comparison.status == "no-baseline"
    assert (tmp_path / "out" / "flashckpt-report.md").is_file()
    out = capsys.readouterr().out
    assert "clirun::ref: kernel eager, peak " in out and "-> no baseline" in out  # one line per scenario, its verdict
    assert "report: out/flashckpt-report.md (results: out/results.json)" in out  # paths relative to the folder


def test_run_bad_option_and_bad_suite_are_usage_errors(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--suite", "default", "--probe", "nope"]) == 2
    assert "--probe: 'nope' is not valid; valid: auto, cpu, cuda, nvml, rss" in capsys.readouterr().err
    assert main(["run", "--suite", "no-such-suite"]) == 2
    assert "no-such-suite" in capsys.readouterr().err
