"""What a suite run records of itself: its wall and CPU time (``RunRecord.wall_time_s``, ``cpu_time_s``, in
results.json and the report header), and its results' scenarios typed, written once and parsed back equal."""

from __future__ import annotations

import json
from pathlib import Path

from fake_runner import FakeRunner

from pytest_flashckpt.config.record_file import read_record
from pytest_flashckpt.config.run_options import Options
from pytest_flashckpt.report.header import header
from pytest_flashckpt.runner.suite import SuiteRun, load_checked_suite

SUITE = """\
name: rec
defaults: {model: tiny, batch_size: 1, seq_len: 32, rounds: 2, attention: eager, measure: [memory, timing]}
scenarios:
  - name: reference
  - name: every-k
    activation: {strategy: every_k, k: 1}
"""


def test_a_suite_run_records_its_wall_time_and_its_typed_scenarios(tmp_path: Path) -> None:
    (tmp_path / "rec.yaml").write_text(SUITE, encoding="utf-8")
    suite = load_checked_suite(str(tmp_path / "rec.yaml"))
    run = SuiteRun(suite, Options(suite="rec.yaml", device="cpu", report="out"), tmp_path, runner=FakeRunner())
    outputs = run.run_all()
    stored = json.loads(outputs.results_path.read_text())
    assert stored["schema_version"] == 2 and stored["wall_time_s"] > 0 and stored["cpu_time_s"] >= 0  # os.times ticks: 0 for a fast fake run
    assert ", wall time " in outputs.report_path.read_text() and ", CPU time " in outputs.report_path.read_text()
    again = read_record(outputs.results_path)
    assert [r.config for r in again.results] == list(suite.scenarios)  # written once, parsed back equal
    assert again.results[1].config.activation.k == 1
    stored.pop("wall_time_s")  # control: a file that did not record it says nothing of it
    stored.pop("cpu_time_s")
    (tmp_path / "old.json").write_text(json.dumps({**stored, "schema_version": 1}))
    assert not any("wall time" in line or "CPU time" in line for line in header(read_record(tmp_path / "old.json")))
