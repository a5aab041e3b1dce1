"""``flashckpt pool-baseline`` with hostile or careless input: a profile id that would write outside ``--out``, runs
that would shrink or hollow out a baseline (errored, interrupted, partial, injected, already pooled), values the
gate cannot read, and an ``--out`` that is a file. Each refusal is one line naming the file and the fix, exit 2,
nothing written; each has a control showing the old code (``pool`` of the given runs alone, the path it built)
would have done the damage."""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from pathlib import Path

import pytest

from pytest_flashckpt.baselines import Baseline
from pytest_flashckpt.baselines.pooled import from_record, pool
from pytest_flashckpt.cli import main
from pytest_flashckpt.config.injection import Injection
from pytest_flashckpt.core.files import MAX_NAME_BYTES, UnsafeName, safe_name
from pytest_flashckpt.core.result import Result, RunRecord
from pytest_flashckpt.config.record_file import read_record
from pytest_flashckpt.config.scenario import Scenario

PROFILE = "cpu-2t-torch2.13.0-d8d0c030"


def _run(folder: Path, scenarios: int = 3, seed: int = 0, profile_id: str = PROFILE, status: str = "measured",
         created: str | None = None, **record_fields) -> Path:
    rng = random.Random(seed)
    results = []
    for i in range(scenarios):
        r = Result("mini", f"s{i}", status, Scenario(f"s{i}", suite="mini"), probe="cpu", reason="boom" if status == "error" else None)
        if status == "measured":
            samples = [rng.gauss(1.2, 0.01) for _ in range(5)]
            r.metrics, r.samples = {"peak_bytes": 100 + i, "overhead": samples[0]}, {"overhead": samples}
        results.append(r)
    record = RunRecord({"device_type": "cpu"}, profile_id, created or f"2026-01-01T00:00:{seed:02d}", "abc", "mini",
                       "cpu", "cpu", results, **record_fields)
    path = folder / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record.write_json(path)
    return path


def _pool(*args) -> int:
    return main(["pool-baseline", *map(str, args)])


@pytest.fixture
def baseline(tmp_path) -> Path:
    """A 34-scenario baseline of two runs, pooled with this command."""
    out = tmp_path / "baselines"
    assert _pool(_run(tmp_path / "r1", 34, seed=1), _run(tmp_path / "r2", 34, seed=2), "--out", out) == 0
    return out / f"{PROFILE}.json"


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


# -- names from input files never become paths ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["../../escaped", "/tmp/anywhere", "a/b", "..", ".", "", " ", "nul\x00x", "tab\tx",
                                  "-rf", "x" * (MAX_NAME_BYTES + 1), 7, None])
def test_safe_name_refuses_what_could_leave_the_folder(name):
    with pytest.raises(UnsafeName, match="profile_id"):
        safe_name(name, "profile_id")


def test_safe_name_takes_real_ids():
    assert safe_name(PROFILE, "profile_id") == PROFILE
    assert safe_name("nvidia-h200-x1-torch2.13.0-0a1b2c3d", "profile_id")


@pytest.mark.parametrize("profile_id", ["../../escaped", "/tmp/flashckpt-escaped-abs"])
def test_a_profile_id_that_would_escape_out_is_refused(tmp_path, capsys, profile_id):
    out = tmp_path / "a" / "b" / "baselines"
    target = out / f"{profile_id}.json"  # control: the path the old code wrote, outside --out
    assert not target.resolve().is_relative_to(out.resolve())
    assert _pool(_run(tmp_path / "run", profile_id=profile_id), "--out", out) == 2
    err = _one_error_line(capsys)
    assert "results.json: profile_id" in err and "cannot name a file" in err
    assert not target.exists() and not out.exists()


# -- a baseline is never lost ---------------------------------------------------------------------------------
def test_runs_whose_scenarios_all_errored_are_refused_and_the_baseline_kept(tmp_path, capsys, baseline):
    before = baseline.read_bytes()
    broken = [_run(tmp_path / f"e{i}", 34, seed=10 + i, status="error") for i in range(2)]
    # control: pooled on their own (the old command), these runs make an empty baseline
    assert pool([from_record(f"e{i}", read_record(p), str(p)) for i, p in enumerate(broken)]).scenarios == {}
    assert _pool(*broken, "--out", baseline.parent) == 2
    err = _one_error_line(capsys)
    assert "e0/results.json: not pooled: 34 scenario(s) errored (mini::s0, mini::s1" in err
    assert baseline.read_bytes() == before


def test_a_partial_run_adds_its_scenarios_and_keeps_the_others(tmp_path, capsys, baseline):
    before = baseline.read_bytes()
    two = _run(tmp_path / "host-c", 2, seed=3)
    assert len(pool([from_record("c", read_record(two), str(two))]).scenarios) == 2  # control: the old command
    assert _pool(two, "--out", baseline.parent) == 0
    out = capsys.readouterr().out
    assert "1 run(s) added (host-c); 0 scenario(s) added; 2 scenario(s) gained runs (mini::s0, mini::s1); 32 unchanged" in out
    assert f"the previous file is " in out and out.rstrip().endswith(".json.bak")
    old, new = json.loads(before), json.loads(baseline.read_text())
    assert new["scenarios"].keys() == old["scenarios"].keys()
    assert [r["label"] for r in new["scenarios"]["mini::s0"]["runs"]] == ["r1", "r2", "host-c"]
    assert all(new["scenarios"][k] == old["scenarios"][k] for k in old["scenarios"] if k not in ("mini::s0", "mini::s1"))
    assert (baseline.parent / f"{PROFILE}.json.bak").read_bytes() == before


def test_replace_starts_afresh_and_keeps_the_old_file(tmp_path, capsys, baseline):
    before = baseline.read_bytes()
    assert _pool(_run(tmp_path / "fresh", 2, seed=4), "--out", baseline.parent, "--replace") == 0
    assert list(json.loads(baseline.read_text())["scenarios"]) == ["mini::s0", "mini::s1"]
    assert (baseline.parent / f"{PROFILE}.json.bak").read_bytes() == before
    assert "2 scenario(s) added" in capsys.readouterr().out


def test_the_baseline_being_added_to_may_be_named_and_is_skipped(tmp_path, capsys, baseline):
    assert _pool(baseline, _run(tmp_path / "host-d", 1, seed=5), "--out", baseline.parent) == 0
    out = capsys.readouterr().out
    assert "the baseline being added to" in out and "1 run(s) added (host-d)" in out


def test_an_interrupted_run_is_refused(tmp_path, capsys):
    ok = _run(tmp_path / "ok", seed=6)
    assert _pool(ok, "--out", tmp_path / "control") == 0  # control: the same run, finished, pools
    partial = _run(tmp_path / "partial", seed=6, interrupted=True)
    assert _pool(partial, "--out", tmp_path / "b") == 2
    assert "partial/results.json: not pooled: an interrupted (partial) run" in _one_error_line(capsys)
    assert not (tmp_path / "b").exists()


def test_a_run_with_an_injected_regression_is_refused(tmp_path, capsys):
    path = _run(tmp_path / "inj", seed=7)
    record = read_record(path)
    assert _pool(path, "--out", tmp_path / "control") == 0  # control: without the note it pools
    record.results[1].notes.append(Injection.parse("step=0.10").describe())  # as runner.run records it
    record.write_json(path)
    assert _pool(path, "--out", tmp_path / "b") == 2
    assert "not pooled: recorded with a regression injected on purpose (injected regression: step +10%)" in _one_error_line(capsys)


def test_the_same_run_twice_is_refused_by_bytes_and_by_samples(tmp_path, capsys, baseline):
    a, b = _run(tmp_path / "a", seed=8), _run(tmp_path / "b", seed=9)
    assert _pool(a, b, "--out", tmp_path / "control") == 0  # control: two different runs pool
    assert _pool(a, a, "--out", tmp_path / "x") == 2
    assert "a/results.json: the same file as" in _one_error_line(capsys)
    copy = tmp_path / "copy" / "results.json"
    copy.parent.mkdir()
    copy.write_text(json.dumps(json.loads(a.read_text())))  # other bytes, the same run
    assert _pool(a, copy, "--out", tmp_path / "y") == 2
    assert "copy/results.json: the same run as" in _one_error_line(capsys)
    r1 = tmp_path / "r1" / "results.json"  # already pooled into the fixture's baseline
    shutil.copy(r1, tmp_path / "again.json")
    assert _pool(tmp_path / "again.json", "--label", "again", "--out", baseline.parent) == 2
    assert "again.json: the same run as run 'r1' of" in _one_error_line(capsys)


def test_a_label_taken_twice_is_refused_with_the_fix(tmp_path, capsys):
    a, b = _run(tmp_path / "x" / "flashckpt-report", seed=11), _run(tmp_path / "y" / "flashckpt-report", seed=12)
    assert _pool(a, b, "--out", tmp_path / "b") == 2
    assert "label 'flashckpt-report' is already that of" in _one_error_line(capsys)
    assert _pool(a, b, "--label", "x", "--label", "y", "--out", tmp_path / "b") == 0


@pytest.mark.parametrize("value", ["NaN", "Infinity", '"fast"'])
def test_values_the_gate_cannot_read_are_refused(tmp_path, capsys, value):
    path = _run(tmp_path / "run", seed=13)
    text = path.read_text()
    assert json.loads(text.replace('"peak_bytes": 100', f'"peak_bytes": {value}'))  # control: json takes it
    path.write_text(text.replace('"peak_bytes": 100', f'"peak_bytes": {value}'))
    assert _pool(path, "--out", tmp_path / "b") == 2
    assert "scenario 'mini::s0': metrics.peak_bytes: expected a finite number" in _one_error_line(capsys)


def test_out_naming_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert _pool(_run(tmp_path / "run"), "--out", tmp_path / "file") == 2
    assert "--out" in _one_error_line(capsys) and (tmp_path / "file").read_text() == "x"


def test_text_samples_are_refused(tmp_path, capsys):
    path = _run(tmp_path / "run", seed=14)
    data = json.loads(path.read_text())
    data["results"][0]["samples"]["overhead"] = ["1.2", "fast"]
    path.write_text(json.dumps(data))
    assert _pool(path, "--out", tmp_path / "b") == 2
    assert "scenario 'mini::s0': samples.overhead: expected a list of finite numbers" in _one_error_line(capsys)


def test_an_unreadable_baseline_is_never_replaced_without_replace(tmp_path, capsys):
    out = tmp_path / "baselines"
    out.mkdir()
    broken = out / f"{PROFILE}.json"
    broken.write_text('{"scenarios": {"mini::s0": ')  # a merge conflict, a truncated file
    run = _run(tmp_path / "run", seed=15)
    assert _pool(run, "--out", out) == 2
    assert "not valid JSON" in _one_error_line(capsys) and broken.read_text().endswith(": ")
    assert _pool(run, "--out", out, "--replace") == 0
    assert (out / f"{PROFILE}.json.bak").read_text() == '{"scenarios": {"mini::s0": '
    assert len(json.loads(broken.read_text())["scenarios"]) == 3


def test_json_nested_past_what_json_reads_is_one_line(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(RecursionError):  # control: what json raises, which the old command did not catch
        json.loads(deep.read_text())
    assert _pool(deep, "--out", tmp_path / "b") == 2
    assert "deep.json: cannot read it as a results or baseline file (" in _one_error_line(capsys)


# -- a scenario whose configuration changed starts afresh, alone ----------------------------------------------------
def _changed_run(folder: Path, seed: int) -> Path:
    """A run of the baseline's 34 scenarios in which ``mini::s0`` was measured in another configuration."""
    path = _run(folder, 34, seed=seed)
    record = read_record(path)
    first = record.results[0]
    first.config = dataclasses.replace(first.config, batch_size=first.config.batch_size + 1)
    record.write_json(path)
    return path


def test_restart_takes_only_the_named_scenario_and_drops_its_old_runs(tmp_path, capsys, baseline):
    before = json.loads(baseline.read_text())
    changed = [_changed_run(tmp_path / f"new-{i}", seed=20 + i) for i in range(2)]
    # control: pooled as before, the changed scenario cannot join the runs the file holds for it
    assert _pool(*changed, "--out", baseline.parent) == 2
    assert "mini::s0 was measured in another configuration" in _one_error_line(capsys)
    assert _pool(*changed, "--out", baseline.parent, "--restart", "mini::s0") == 0
    out = capsys.readouterr().out
    assert "2 run(s) added (new-0, new-1); 1 scenario(s) restarted from these runs alone (mini::s0); 0 scenario(s) added; " \
           "0 scenario(s) gained runs; 33 unchanged" in out
    after = json.loads(baseline.read_text())
    assert [r["label"] for r in after["scenarios"]["mini::s0"]["runs"]] == ["new-0", "new-1"]
    assert after["scenarios"]["mini::s0"]["fingerprint"] != before["scenarios"]["mini::s0"]["fingerprint"]
    assert all(after["scenarios"][k] == before["scenarios"][k] for k in before["scenarios"] if k != "mini::s0")


def test_restart_of_a_scenario_no_run_measured_is_refused(tmp_path, capsys, baseline):
    before = baseline.read_bytes()
    assert _pool(_run(tmp_path / "host-e", 2, seed=6), "--out", baseline.parent, "--restart", "mini::s9") == 2
    assert "--restart mini::s9: none of the runs given measured it" in _one_error_line(capsys)
    assert _pool(_run(tmp_path / "host-f", 2, seed=7), "--out", baseline.parent, "--restart", "mini::s0", "--replace") == 2
    assert "give one of them" in _one_error_line(capsys)
    assert baseline.read_bytes() == before
