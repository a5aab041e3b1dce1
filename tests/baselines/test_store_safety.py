"""A baseline is never lost: saving over a file that cannot be read as a baseline refuses (the file is left byte for
byte), wrong-typed entries are errors rather than silently ungated metrics, and the temporary files of a killed
write live where git does not see them and are removed by the next write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_flashckpt.baselines import Baseline, BaselineError, save_run
from pytest_flashckpt.baselines.gate import Gate
from pytest_flashckpt.baselines.regression_verdicts import Thresholds
from pytest_flashckpt.baselines.store import check_saveable
from pytest_flashckpt.core.files import TEMP_FOLDER, atomic_write_text, remove_stale_temp
from pytest_flashckpt.core.result import Result, RunRecord
from pytest_flashckpt.config.scenario import Scenario

PROFILE = "p"
GOOD = {"commit": None, "metrics": {"overhead": 1.2, "peak_bytes": 100}, "samples": {"overhead": [1.2, 1.2]}}


def _record() -> RunRecord:
    r = Result("mini", "a", "measured", Scenario("a", suite="mini"), probe="cpu")
    r.metrics = {"peak_bytes": 100, "overhead": 1.2}
    r.samples = {"overhead": [1.2] * 3}
    return RunRecord({"device_type": "cpu"}, PROFILE, "2026-01-01T00:00:00", None, "mini", "cpu", "cpu", [r])


def _baseline(scenarios) -> str:
    return json.dumps({"schema_version": 1, "profile_id": PROFILE, "profile": {}, "scenarios": scenarios})


UNREADABLE = [
    (_baseline({f"mini::s{i}": GOOD for i in range(31)})[:200].encode(), "not valid JSON"),  # truncated
    (b"<<<<<<< HEAD\n{}\n=======\n{}\n>>>>>>> branch\n", "not valid JSON"),  # a merge conflict
    (b"[1, 2]", "not a pytest-flashckpt baseline"),
    (json.dumps({"schema_version": 99, "scenarios": {}}).encode(), "schema_version 99 is not supported"),
    (_baseline({"mini::x": GOOD}).replace("mini::x", "caf\u00e9").encode("latin-1"), "not UTF-8 text"),
    (_baseline({"mini::x": {"metrics": {"overhead": "1.2"}}}).encode(), "scenario 'mini::x': metrics.overhead: expected a finite number, got str '1.2'"),
]


@pytest.mark.parametrize(("content", "message"), UNREADABLE, ids=["truncated", "conflict", "list", "newer", "latin1", "str-metric"])
def test_saving_over_an_unreadable_baseline_refuses_and_keeps_it(tmp_path, content, message):
    path = tmp_path / f"{PROFILE}.json"
    path.write_bytes(content)
    for attempt in (lambda: check_saveable(tmp_path, PROFILE), lambda: save_run(tmp_path, _record())):
        with pytest.raises(BaselineError, match=message) as info:
            attempt()
        assert str(path) in str(info.value) and ("mv " in str(info.value))  # names the file and the way out
    assert path.read_bytes() == content  # byte for byte
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_a_folder_where_the_baseline_file_should_be_is_refused(tmp_path):
    (tmp_path / f"{PROFILE}.json").mkdir()
    with pytest.raises(BaselineError, match="is a directory, not a baseline file"):
        save_run(tmp_path, _record())
    with pytest.raises(BaselineError, match="is a directory"):
        Gate(tmp_path, PROFILE, Thresholds())  # the comparison side sees it too (it was 'no baseline' before)
    (tmp_path / "file").write_text("x")
    with pytest.raises(BaselineError, match="the baseline folder is a file"):
        check_saveable(tmp_path / "file", PROFILE)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ([1, 2], "the entry must be a mapping, got list"),
        ({"metrics": [1.2]}, "metrics must be a mapping"),
        ({"metrics": {"peak_bytes": True}}, "metrics.peak_bytes: expected a finite number, got bool"),
        ({"metrics": {"overhead": None}}, "metrics.overhead: expected a finite number, got NoneType"),
        ({"metrics": {"overhead": float("nan")}}, "metrics.overhead: expected a finite number"),
        ({"metrics": {}, "samples": {"overhead": [1.0, "x"]}}, "samples.overhead: expected a list of finite numbers"),
        ({"metrics": {}, "samples": {"overhead": 1.0}}, "samples.overhead: expected a list of finite numbers"),
    ],
)
def test_wrong_typed_entries_are_errors_not_silently_ungated(tmp_path, entry, message):
    path = tmp_path / f"{PROFILE}.json"
    path.write_text(_baseline({"mini::a": entry}))
    with pytest.raises(BaselineError, match=message):
        Baseline.read(path)
    with pytest.raises(BaselineError, match="scenario 'mini::a'"):
        Gate(tmp_path, PROFILE, Thresholds())


def test_a_good_baseline_is_merged_and_nothing_else_is_left_in_the_folder(tmp_path):
    path = tmp_path / f"{PROFILE}.json"
    path.write_text(_baseline({"mini::kept": GOOD}))
    save_run(tmp_path, _record())
    assert set(json.loads(path.read_text())["scenarios"]) == {"mini::kept", "mini::a"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temp folder, no lock file


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_killed_writers_temp_files_are_git_ignored_and_removed_by_the_next_write(tmp_path):
    """A writer killed with SIGKILL in the middle of a write: its temp file is in the git-ignored temp folder
    (``git status`` stays clean), and the next save removes it (and the old-style hidden temp files too)."""
    code = (
        "import sys, time\nfrom pytest_flashckpt.core.files import atomic_write\n"
        f"with atomic_write({str(tmp_path / (PROFILE + '.json'))!r}) as fh:\n"
        "    fh.write(b'{\"half'); fh.flush(); print('writing', flush=True); time.sleep(60)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env, text=True) as proc:
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    (left,) = (tmp_path / TEMP_FOLDER).glob("*.tmp")
    assert not (tmp_path / f"{PROFILE}.json").exists()  # the target was never half written
    old_style = tmp_path / f".{PROFILE}.json.{_dead_pid()}-1.tmp"  # what earlier versions left beside the file
    old_style.write_text("{")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    status = subprocess.run(["git", "-C", str(tmp_path), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True).stdout
    assert left.name not in status and ".flashckpt-tmp" not in status
    save_run(tmp_path, _record())
    assert not left.exists() and not old_style.exists() and not (tmp_path / TEMP_FOLDER).exists()
    assert Baseline.read(tmp_path / f"{PROFILE}.json").scenarios.keys() == {"mini::a"}


def test_a_live_writers_temp_file_and_files_not_ours_are_left_alone(tmp_path):
    temp = tmp_path / TEMP_FOLDER
    temp.mkdir()
    live = temp / f"x.json.{os.getppid()}-7.tmp"  # our parent process: alive
    live.write_text("{")
    theirs = tmp_path / ".notes.tmp"  # a user's file with a .tmp name: not one of ours
    theirs.write_text("mine")
    old = time.time() - 7200
    os.utime(theirs, (old, old))
    atomic_write_text(tmp_path / "x.json", "{}")
    assert live.exists() and theirs.exists()
    assert remove_stale_temp(tmp_path) == []


def test_a_write_whose_temp_folder_another_writer_removes_before_its_ignore_file_retries(tmp_path, monkeypatch):
    """Another writer's cleanup can remove the empty temp folder between this writer's mkdir and its ``.gitignore``
    (seen as a crashed baseline save on a loaded 2-core host): the write retries and lands."""
    from pytest_flashckpt.core import files

    real, raced = files._temp_folder, []

    def removed_under_us(parent: Path) -> Path:
        if not raced:
            raced.append(True)
            folder = parent / TEMP_FOLDER
            folder.mkdir(exist_ok=True)
            folder.rmdir()  # the other writer's remove_stale_temp, in the window
            with open(folder / ".gitignore", "x", encoding="utf-8"):  # FileNotFoundError, as the real one meets it
                pass
        return real(parent)

    monkeypatch.setattr(files, "_temp_folder", removed_under_us)
    atomic_write_text(tmp_path / "b.json", "{}")
    assert raced and (tmp_path / "b.json").read_text() == "{}"
    assert list(tmp_path.iterdir()) == [tmp_path / "b.json"]
