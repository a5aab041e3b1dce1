"""``flashckpt history`` over a hostile or mixed folder: things named results.json that are no file (a FIFO that
would block the read forever, a folder, link loops), files whose values are not what they claim (a numeric
``created``, text samples, NaN / Infinity / text metrics), markdown and HTML in the texts of a result file, and
runs of two machines (profiles). Each case has a control showing the old reader would hang, crash, be fooled or
pass the text on raw."""

from __future__ import annotations

import json
import math
import os
import random
import re
import signal
from pathlib import Path

import pytest

from pytest_flashckpt.cli import main
from pytest_flashckpt.core.result import Result, RunRecord
from pytest_flashckpt.history.changes import change_points
from pytest_flashckpt.history.series import build_series, read_runs
from pytest_flashckpt.config.record_file import read_record, result_from_dict
from pytest_flashckpt.config.scenario import Scenario

pytest.importorskip("otava.analysis", reason="Apache Otava is optional: pip install --no-deps apache-otava==0.8.0 scipy")


def _write(folder: Path, i: int, overhead, profile_id: str = "p", scenario: str = "a", commit: str | None = None,
           profile: dict | None = None) -> Path:
    r = Result("s", scenario, "measured", Scenario(scenario, suite="s"), probe="cpu")
    r.metrics = {"overhead": overhead, "peak_bytes": 100}
    record = RunRecord(profile or {"device_name": profile_id}, profile_id, f"2026-01-01T{i // 60:02d}:{i % 60:02d}:00",
                       commit or f"c{i:03d}", "s", "cpu", "cpu", [r])
    path = folder / f"run-{i:03d}" / "results.json"
    path.parent.mkdir(parents=True)
    record.write_json(path)
    return path


def _two_runs(folder: Path) -> Path:
    _write(folder, 0, 1.1)
    _write(folder, 1, 1.1)
    return folder


def _history(folder: Path, out: Path, capsys) -> tuple[str, str]:
    assert main(["history", str(folder), "--no-plots", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    return (out / "history.md").read_text(), captured.err


@pytest.fixture
def no_hang():
    """Fail instead of hanging forever when a read blocks (a FIFO)."""
    def hung(*_):
        raise TimeoutError("flashckpt history blocked")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


# -- things named results.json that are not files -------------------------------------------------------------
def test_a_fifo_named_results_json_is_skipped_unopened(tmp_path, capsys, no_hang):
    runs = _two_runs(tmp_path / "runs")
    (runs / "pipe").mkdir()
    fifo = runs / "pipe" / "results.json"
    os.mkfifo(fifo)
    assert fifo in runs.rglob("results.json")  # control: the old reader found it, and read_text blocks on a FIFO
    md, err = _history(runs, tmp_path / "out", capsys)
    assert f"{fifo}: a FIFO (named pipe), not a regular file; never opened; file skipped" in err
    assert "Files skipped** (1)" in md and "2 runs from" in md


def test_a_folder_named_results_json_is_skipped(tmp_path, capsys):
    runs = _two_runs(tmp_path / "runs")
    (runs / "x" / "results.json").mkdir(parents=True)
    with pytest.raises(IsADirectoryError):  # control: the old reader's read_text
        (runs / "x" / "results.json").read_text()
    _, err = _history(runs, tmp_path / "out", capsys)
    assert "x/results.json: a folder, not a regular file; never opened; file skipped" in err


def test_link_loops_are_skipped_and_never_walked(tmp_path, capsys):
    runs = _two_runs(tmp_path / "runs")
    (runs / "self").mkdir()
    os.symlink("results.json", runs / "self" / "results.json")  # a link to itself
    os.symlink(runs, runs / "up")  # a folder link back up: a walk that follows links never ends
    assert (runs / "up").resolve() == runs.resolve()  # control: the loop is real
    _, err = _history(runs, tmp_path / "out", capsys)
    assert "self/results.json: Too many levels of symbolic links; file skipped" in err


# -- values that are not what they claim ----------------------------------------------------------------------
def test_a_numeric_created_skips_that_file(tmp_path, capsys):
    runs = _two_runs(tmp_path / "runs")
    bad = _write(runs, 2, 1.1)
    data = json.loads(bad.read_text())
    data["created"] = 1767225600
    bad.write_text(json.dumps(data))
    with pytest.raises(TypeError):  # control: the old reader took it, then ordering the runs crashed
        sorted(["2026-01-01T00:00:00", read_record(bad).created])
    md, err = _history(runs, tmp_path / "out", capsys)
    assert "run-002/results.json: 'created' is 1767225600, not a timestamp text, so the run cannot be ordered; file skipped" in err
    assert "2 runs from" in md


def test_text_samples_skip_that_file(tmp_path, capsys):
    runs = _two_runs(tmp_path / "runs")
    bad = _write(runs, 2, 1.1)
    data = json.loads(bad.read_text())
    data["results"][0]["samples"] = "1.1, 1.2"
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError):  # control: what the reader raises (the history command catches it)
        result_from_dict(data["results"][0])
    _, err = _history(runs, tmp_path / "out", capsys)
    assert "run-002/results.json:" in err and "file skipped" in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["NaN", "Infinity", '"fast"'])
def test_a_value_that_is_not_a_finite_number_is_dropped_and_said(tmp_path, capsys, value):
    runs = _two_runs(tmp_path / "runs")
    bad = _write(runs, 2, 1.1)
    bad.write_text(bad.read_text().replace('"overhead": 1.1', f'"overhead": {value}'))
    taken = read_record(bad).results[0].metrics["overhead"]
    assert isinstance(taken, str) or not math.isfinite(taken)  # control: the file reads, the value with it
    md, err = _history(runs, tmp_path / "out", capsys)
    assert "run-002/results.json: s::a overhead = " in err and "not a finite number; value dropped" in err
    (series,) = build_series(read_runs(runs), ("overhead",))
    assert series.values == [1.1, 1.1] and "Values dropped** (1)" in md


# -- texts from result files ----------------------------------------------------------------------------------
def test_markdown_and_html_from_result_files_are_escaped(tmp_path, capsys):
    hostile = "<img src=x onerror=alert(1)>|[click](https://evil.example)"
    rng = random.Random(3)
    for i in range(24):
        _write(tmp_path / "runs", i, rng.gauss(1.1, 0.01) * (1.1 if i >= 12 else 1.0), scenario=hostile,
               commit="`rm -rf`<b>x</b>")
    assert hostile in json.loads((tmp_path / "runs" / "run-000" / "results.json").read_text())["results"][0]["scenario"]  # control
    md, _ = _history(tmp_path / "runs", tmp_path / "out", capsys)
    assert "| s::&lt;img src=x onerror=alert\\(1\\)&gt;\\|\\[click\\]\\(https:\\/\\/evil.example\\) | overhead |" in md
    for raw in ("<img", "<b>", "](", "https://"):
        assert raw not in md
    assert "\\`rm -rf\\`&lt;b&gt;x" in md and not re.search(r"(?<!\\)`", md)  # every backtick escaped


# -- two machines ---------------------------------------------------------------------------------------------
def test_a_machine_change_is_a_segment_boundary_never_a_change_point(tmp_path, capsys):
    rng = random.Random(5)
    values = [rng.gauss(1.10, 0.01) for _ in range(12)] + [rng.gauss(1.30, 0.01) for _ in range(12)]
    assert [cp.index for cp in change_points(values)] == [12]  # control: unsegmented, the machine reads as a change
    for i, v in enumerate(values):
        machine = "box-a" if i < 12 else "box-b"
        _write(tmp_path / "runs", i, v, profile_id=f"cpu-2t-{machine}", profile={"device_name": machine})
    md, _ = _history(tmp_path / "runs", tmp_path / "out", capsys)
    assert "_No change point in any series._" in md
    assert "The profile changed 1 time(s)" in md
    assert "| 13 (2026-01-01T00:12:00) | cpu-2t-box-a | cpu-2t-box-b | device\\_name: box-a → box-b |" in md


def test_a_change_within_a_segment_is_still_found(tmp_path, capsys):
    rng = random.Random(6)
    values = [rng.gauss(1.10, 0.01) for _ in range(8)] + [rng.gauss(1.30, 0.01) for _ in range(10)] + \
        [rng.gauss(1.30, 0.01) * 1.08 for _ in range(10)]
    for i, v in enumerate(values):
        _write(tmp_path / "runs", i, v, profile_id="cpu-a" if i < 8 else "cpu-b")
    md, _ = _history(tmp_path / "runs", tmp_path / "out", capsys)
    rows = [line for line in md.splitlines() if line.startswith("| s::a | overhead |")]
    assert [row.split(" | ")[2] for row in rows] == ["19 (2026-01-01T00:18:00)"]


def test_out_naming_a_file_is_one_line(tmp_path, capsys):
    runs = _two_runs(tmp_path / "runs")
    (tmp_path / "file").write_text("x")
    assert main(["history", str(runs), "--out", str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out" in err and "is a file" in err


def test_json_nested_past_what_json_reads_skips_that_file(tmp_path, capsys):
    runs = _two_runs(tmp_path / "runs")
    (runs / "deep").mkdir()
    (runs / "deep" / "results.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(RecursionError):  # control: what json raises, which the old reader did not catch
        json.loads((runs / "deep" / "results.json").read_text())
    _, err = _history(runs, tmp_path / "out", capsys)
    assert "deep/results.json: JSON nested too deep to be a results file; file skipped" in err
