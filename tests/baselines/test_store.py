"""Baseline files: diffable JSON, merge-on-save (only the scenarios that ran), clear errors, profile lookup."""

import json

import pytest

from pytest_flashckpt.baselines import Baseline, BaselineError, locate
from pytest_flashckpt.core.result import Result
from pytest_flashckpt.config.scenario import Scenario


def _result(name, status="measured", overhead=1.2):
    r = Result("mini", name, status, Scenario(name, suite="mini"))
    if status == "measured":
        r.metrics = {"peak_bytes": 100, "overhead": overhead, "step_time_s": 0.5, "memory_saving": 0.3, "kernel": "x"}
        r.samples = {"overhead": [overhead] * 3, "step_time_s": [0.5] * 3, "reference_step_time_s": [0.4] * 3}
    r.probe = "cpu"
    return r


def test_saved_file_is_sorted_indented_and_reads_back(tmp_path):
    path = tmp_path / "p.json"
    baseline = Baseline("p", {"device_type": "cpu"})
    assert baseline.update([_result("a"), _result("b", status="skipped")], "abc", "2026-01-01") == ["mini::a"]
    baseline.write(path)
    text = path.read_text()
    data = json.loads(text)
    assert text == json.dumps(data, indent=2, sort_keys=True) + "\n"
    assert data["schema_version"] == 2 and list(data["scenarios"]) == ["mini::a"]
    entry = data["scenarios"]["mini::a"]
    assert entry["metrics"] == {"overhead": 1.2, "peak_bytes": 100, "step_time_s": 0.5}  # guarded metrics only
    assert entry["samples"] == {"overhead": [1.2] * 3, "step_time_s": [0.5] * 3}
    assert entry["rounds"] == 3 and entry["commit"] == "abc" and entry["probe"] == "cpu"
    assert {k: e.to_dict() for k, e in Baseline.read(path).scenarios.items()} == data["scenarios"]
    assert entry["fingerprint"].startswith("sha256:") and entry["config"]["seq_len"] == 512  # the configuration measured
    assert not list(tmp_path.glob(".*.tmp"))


def test_update_replaces_only_the_scenarios_that_ran(tmp_path):
    baseline = Baseline("p", {})
    baseline.update([_result("a", overhead=1.1), _result("b", overhead=1.5)], None, "t1")
    baseline.update([_result("a", overhead=1.3), _result("b", status="skipped")], None, "t2")
    assert baseline.scenarios["mini::a"].metrics["overhead"] == 1.3
    assert baseline.scenarios["mini::b"].metrics["overhead"] == 1.5 and baseline.scenarios["mini::b"].updated == "t1"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        ("[]", "not a pytest-flashckpt baseline"),
        ('{"schema_version": 99, "scenarios": {}}', "schema_version 99 is not supported"),
    ],
)
def test_unusable_files_are_errors_naming_the_file(tmp_path, text, message):
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(BaselineError, match=message) as info:
        Baseline.read(path)
    assert str(path) in str(info.value)


def test_locate_finds_this_profile_and_lists_others(tmp_path):
    assert locate(tmp_path / "missing", "p") .others == ()
    (tmp_path / "other.json").write_text("{}")
    found = locate(tmp_path, "p")
    assert not found.exists and [p.name for p in found.others] == ["other.json"]
    (tmp_path / "p.json").write_text("{}")
    assert locate(tmp_path, "p").exists
