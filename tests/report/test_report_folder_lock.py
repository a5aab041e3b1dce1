"""Two runs writing the same report folder at once: results.json, the report and its plots are written as one
unit under a lock on the folder, so the folder ends with one run's files, never one's results beside the other's
report. Run A is made slow (its plots take 0.6 s) and B starts while A is writing."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import report_synthetic

from pytest_flashckpt.report import folder as report_folder
from pytest_flashckpt.report import markdown


def _slow_plots(monkeypatch) -> None:
    write_plots = markdown.write_plots

    def slow(record, out_dir):
        time.sleep(0.6 if record.suite == "run-a" else 0.05)
        return write_plots(record, out_dir)

    monkeypatch.setattr(markdown, "write_plots", slow)


def _write_both(tmp_path) -> tuple[str, str]:
    a, b = report_synthetic.record(), report_synthetic.record()
    a.suite, b.suite = "run-a", "run-b"
    ta = threading.Thread(target=report_folder.write_run_folder, args=(a, tmp_path))
    tb = threading.Thread(target=report_folder.write_run_folder, args=(b, tmp_path))
    ta.start()
    time.sleep(0.2)  # A has written results.json and is drawing its plots
    tb.start()
    ta.join()
    tb.join()
    results_suite = json.loads((tmp_path / "results.json").read_text())["suite"]
    report = (tmp_path / markdown.REPORT_NAME).read_text()
    return results_suite, "run-a" if "**suite** `run-a`" in report else "run-b"


def test_the_folder_holds_one_runs_files(tmp_path, monkeypatch) -> None:
    _slow_plots(monkeypatch)
    results_suite, report_suite = _write_both(tmp_path)
    assert results_suite == report_suite  # B waited for A (or A for B), then replaced all of its files


def test_without_the_lock_the_same_overlap_leaves_a_mix(tmp_path, monkeypatch) -> None:
    """The test above can fail: with the lock made a no-op, B's results sit beside A's report."""
    _slow_plots(monkeypatch)
    monkeypatch.setattr(report_folder, "locked", lambda folder: contextlib.nullcontext())
    assert _write_both(tmp_path) == ("run-b", "run-a")
