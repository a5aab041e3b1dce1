"""The gate of a suite run: statuses, the comparison structure the report renders, failure and CI texts."""

import re

import pytest

from pytest_flashckpt.baselines import Baseline, Gate, Thresholds, failure_text
from pytest_flashckpt.report.regression import append_step_summary, markdown_table
from pytest_flashckpt.report.terminal import regression_lines
from pytest_flashckpt.core.result import Result
from pytest_flashckpt.config.scenario import Scenario

KEYS = {"status", "baseline_path", "baseline_profile_id", "message", "verdicts", "notes"}
ROW_KEYS = {"scenario", "metric", "baseline", "current", "change", "p_value", "verdict", "smallest_p", "reason", "busy_machine"}


def _result(name, overhead_samples, peak=100, status="measured"):
    r = Result("mini", name, status, Scenario(name, suite="mini"))
    r.probe = "cpu"
    if status == "measured":
        r.metrics = {"peak_bytes": peak, "overhead": sorted(overhead_samples)[len(overhead_samples) // 2]}
        r.samples = {"overhead": list(overhead_samples)}
    return r


@pytest.fixture
def baseline_dir(tmp_path):
    baseline = Baseline("prof", {"device_type": "cpu"})
    baseline.update([_result("a", [1.20, 1.21, 1.19, 1.22, 1.20, 1.18, 1.21, 1.19, 1.20, 1.22])], None, "t")
    baseline.write(tmp_path / "prof.json")
    return tmp_path


def test_statuses(baseline_dir, tmp_path_factory):
    assert Gate(baseline_dir, "prof", Thresholds(), enabled=False).comparison().status == "disabled"
    assert Gate(tmp_path_factory.mktemp("empty"), "prof", Thresholds()).comparison().status == "no-baseline"
    other = Gate(baseline_dir, "another", Thresholds()).comparison()
    assert other.status == "other-profile" and other.baseline_profile_id == "prof"
    assert "other profiles (prof)" in other.message and "comparison skipped" in other.message
    compared = Gate(baseline_dir, "prof", Thresholds()).comparison()
    assert set(compared.to_dict()) == KEYS and compared.status == "compared"
    assert compared.baseline_path == str(baseline_dir / "prof.json") and compared.baseline_profile_id == "prof"


def test_regression_message_has_baseline_current_change_and_p(baseline_dir):
    gate = Gate(baseline_dir, "prof", Thresholds())
    rows = gate.judge(_result("a", [1.50, 1.52, 1.49, 1.51, 1.50], peak=100))
    assert {r.metric: r.verdict for r in rows} == {"peak_bytes": "ok", "overhead": "regressed"}
    assert all(set(r.to_dict()) == ROW_KEYS for r in rows)
    text = failure_text(rows, gate.lookup.path, gate.thresholds)
    assert "overhead: baseline 1.2, current 1.5, change +25.0%, p = 0.000333 (alpha 0.01)" in text
    assert "--flashckpt-save-baseline" in text
    assert failure_text([r for r in rows if r.metric == "peak_bytes"], gate.lookup.path, gate.thresholds) is None


def test_skipped_and_unknown_scenarios_are_not_compared(baseline_dir):
    gate = Gate(baseline_dir, "prof", Thresholds())
    assert gate.judge(_result("a", [], status="skipped")) == []
    assert gate.judge(_result("new", [1.0])) == []
    comparison = gate.comparison()
    assert [(n.kind, n.text) for n in comparison.notes] == [("coverage", "not in the baseline: mini::new")]
    assert comparison.text.endswith("; not in the baseline: mini::new")


def test_terminal_and_step_summary(baseline_dir, tmp_path):
    gate = Gate(baseline_dir, "prof", Thresholds())
    gate.judge(_result("a", [1.00, 1.01, 0.99, 1.00, 1.00], peak=90))
    comparison = gate.comparison()
    lines = regression_lines(comparison)
    assert lines[0] == f"baseline {baseline_dir / 'prof.json'}: 2 improved" and "0 regressed, 0 missing, 2 improved" in comparison.message
    assert any("refresh the baseline with --flashckpt-save-baseline" in line for line in lines)
    summary = tmp_path / "summary.md"
    summary.write_text("before\n")
    assert append_step_summary(comparison, {"GITHUB_STEP_SUMMARY": str(summary)}) == summary
    text = summary.read_text()
    assert text.startswith("before\n### pytest-flashckpt baseline comparison")
    assert re.search(r"\| `mini::a` +\| overhead +\| 1\.20x +\| 1\.00x +\| -16\.7% +\|", text) and markdown_table(comparison) in text
    assert append_step_summary(comparison, {}) is None
