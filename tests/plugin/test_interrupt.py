"""Interrupted is a state: Ctrl-C or SIGTERM in the middle of a suite keeps the finished scenarios, writes the
report and results.json marked interrupted, never updates a baseline, and exits 2 (pytest's Interrupted), in
``SuiteRun.run_all`` (the suite loop outside pytest), ``flashckpt run`` and the pytest plugin."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from fake_runner import conftest_text

from pytest_flashckpt.core.result import Result, RunRecord
from pytest_flashckpt.config.record_file import read_record

SUITE = """\
name: stop
defaults: {model: tiny, batch_size: 1, seq_len: 32, attention: eager, measure: [memory]}
scenarios:
  - name: one
  - name: two
  - name: three
"""


def _measured(scenario, ctx) -> Result:

    result = Result(scenario.suite, scenario.name, "measured", scenario, device=str(ctx.device), probe=ctx.probe)
    result.metrics = {"peak_bytes": 1000, "reference_peak_bytes": 1000, "memory_saving": 0.0}
    return result


def _stopping_at(name: str, stop):
    """A measure that measures instantly and is stopped (``stop()``) while running scenario ``name``."""

    def measure(scenario, ctx) -> Result:
        if scenario.name == name:
            stop()
            time.sleep(5)  # a signal is delivered at the next bytecode: never reached
            raise AssertionError("not interrupted")
        return _measured(scenario, ctx)

    return measure


def _raise_keyboard_interrupt():
    raise KeyboardInterrupt


def _send_sigterm():
    os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture
def suite_file(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "stop.yaml"
    path.write_text(SUITE, encoding="utf-8")
    return path


@pytest.fixture
def default_sigterm():
    """SIGTERM at its default while the test runs (so the run installs its own handler), restored after."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, previous)


def _check_interrupted(folder: Path, how: str) -> RunRecord:
    record = read_record(folder / "results.json")
    assert record.interrupted is True
    assert [r.id for r in record.results] == ["stop::one"]  # the finished scenario kept, the running one dropped
    assert any(f"interrupted ({how}) after 1 of 3 scenario(s)" in n for n in record.notes)
    report = (folder / "flashckpt-report.md").read_text(encoding="utf-8")
    assert "**INTERRUPTED**" in report.split("- **suite**")[0]  # in the header, before anything else
    return record


@pytest.mark.parametrize(("stop", "how"), [(_raise_keyboard_interrupt, "Ctrl-C"), (_send_sigterm, "SIGTERM")])
def test_run_all_keeps_finished_scenarios_and_never_saves_the_baseline(suite_file, tmp_path, default_sigterm, stop, how):
    from pytest_flashckpt.config.run_options import Options
    from pytest_flashckpt.runner.suite import SuiteRun, load_checked_suite
    from pytest_flashckpt.runner.summary import end_summary

    options = Options(suite=str(suite_file), device="cpu", report="out", save_baseline=True)
    run = SuiteRun(load_checked_suite(str(suite_file)), options, tmp_path, runner=_stopping_at("two", stop))
    outputs = run.run_all()
    assert run.stopped_by == how and f"INTERRUPTED ({how}): 1 of 3 scenario(s) finished" in end_summary(run, outputs)[-1]
    assert outputs.record.interrupted and outputs.baseline_path is None
    _check_interrupted(tmp_path / "out", how)
    assert not (tmp_path / "baselines").exists()  # a partial run never becomes a baseline
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the run's SIGTERM handler is gone again


def test_a_complete_run_is_not_marked_interrupted(suite_file, tmp_path):
    from pytest_flashckpt.config.run_options import Options
    from pytest_flashckpt.runner.suite import SuiteRun, load_checked_suite

    run = SuiteRun(load_checked_suite(str(suite_file)), Options(suite=str(suite_file), device="cpu", report="out"),
                   tmp_path, runner=_measured)
    outputs = run.run_all()
    data = json.loads((tmp_path / "out" / "results.json").read_text(encoding="utf-8"))
    assert data["interrupted"] is False and len(data["results"]) == 3 and not outputs.record.interrupted
    assert "INTERRUPTED" not in (tmp_path / "out" / "flashckpt-report.md").read_text(encoding="utf-8")


def test_flashckpt_run_ctrl_c_exits_2_with_the_finished_scenarios_and_no_traceback(suite_file, tmp_path, monkeypatch, capsys):
    import pytest_flashckpt.runner.run as run_module
    from pytest_flashckpt.cli import main

    monkeypatch.setattr(run_module, "run_scenario", _stopping_at("two", _raise_keyboard_interrupt))
    assert main(["run", "--suite", "stop.yaml", "--report", "out", "--device", "cpu", "--save-baseline"]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    assert "INTERRUPTED (Ctrl-C): 1 of 3 scenario(s) finished; the report and results.json are marked interrupted" in captured.out
    assert "stop::one" in captured.out and "baseline saved" not in captured.out
    _check_interrupted(tmp_path / "out", "Ctrl-C")
    assert not (tmp_path / "baselines").exists()


@pytest.mark.slow
def test_pytest_sigterm_mid_suite_is_interrupted_exit_2(pytester):
    """One subprocess: SIGTERM (what CI and ``timeout`` send) arrives as scenario ``two`` starts. The subprocess
    measures through the shared ``FakeRunner`` (tests/fake_runner.py): what is checked is the interruption."""
    pytester.makefile(".yaml", stop=SUITE)
    pytester.makeconftest(conftest_text(extra=(
        "\n\ndef pytest_runtest_setup(item):\n"
        "    import os, signal\n\n"
        "    if item.name == 'two':\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
    )))
    result = pytester.runpytest_subprocess("--flashckpt-suite=stop.yaml", "--flashckpt-device=cpu", "-p", "no:benchmark",
                                           "-p", "no:hypothesispytest",  # it imports hypothesis at the end; unused here
                                           "--flashckpt-report=out", "--flashckpt-save-baseline")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*INTERRUPTED (SIGTERM): 1 of 3 scenario(s) finished; the report and results.json are marked "
                                 "interrupted; no baseline was updated*"])
    assert "baseline saved" not in result.stdout.str()
    record = _check_interrupted(pytester.path / "out", "SIGTERM")
    assert record.results[0].metrics["state_bytes"] == 50 * 2**20  # measured by the subprocess's FakeRunner
    assert not (pytester.path / "baselines").exists()


def test_a_killed_runs_checkpoint_work_folder_is_removed_by_the_next_run(tmp_path):
    """SIGKILL in a checkpoint pass leaves its work folder; the next run's preflight removes it (its owner's lock
    died with it), while a live run's folder, locked, is left alone."""
    import subprocess
    import sys

    from pytest_flashckpt.core.files import remove_abandoned, work_folder

    code = (
        "import sys, time\nfrom pytest_flashckpt.core.files import work_folder\n"
        f"with work_folder({str(tmp_path)!r}, 'ckpt') as root:\n"
        "    (root / 'state.pt').write_bytes(b'x' * 4096); print(root, flush=True); time.sleep(60)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env, text=True) as proc:
        killed = Path(proc.stdout.readline().strip())
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert (killed / "state.pt").is_file()  # what SIGKILL leaves
    with work_folder(tmp_path, "ckpt") as live:
        old = time.time() - 3600
        for folder in (killed, live):
            os.utime(folder, (old, old))  # past the grace a just-made folder gets
        assert remove_abandoned(tmp_path) == [killed]
        assert not killed.exists() and live.is_dir()
    assert not live.exists()  # removed by its own run at the end
