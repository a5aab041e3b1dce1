"""Two runs writing the same report folder at once: results.json, the report and its plots are written as one
unit under a lock on the folder, so the folder ends with one run's files, never one's results beside the other's
report. Run A is made slow (its plots wait until B's whole write is done, at most 0.5 s) and B starts once A has
written results.json and is drawing its plots. No figure is drawn: what is checked is which run's files the folder
ends with (tests/report/test_report_plots.py draws the plots)."""

from __future__ import annotations

import contextlib
import json
import threading

import report_synthetic

from pytest_flashckpt.report import folder as report_folder
from pytest_flashckpt.report import markdown
from pytest_flashckpt.report.plots import Plot

B_WRITE_S = 0.5  # how long A's plots wait for B: B's write (~20 ms) when nothing holds it back; the lock does


def _write_both(tmp_path, monkeypatch) -> tuple[str, str]:
    a, b = report_synthetic.record(), report_synthetic.record()
    a.suite, b.suite = "run-a", "run-b"
    a_drawing, b_done = threading.Event(), threading.Event()

    def plots(record, out_dir):
        if record.suite == "run-a":
            a_drawing.set()
            b_done.wait(timeout=B_WRITE_S)
        return {key: Plot(key, key, reason="not drawn in this test") for key in ("pareto", "attention", "throughput", "saves")}

    def write_b() -> None:
        report_folder.write_run_folder(b, tmp_path)
        b_done.set()

    monkeypatch.setattr(markdown, "write_plots", plots)
    ta = threading.Thread(target=report_folder.write_run_folder, args=(a, tmp_path))
    tb = threading.Thread(target=write_b)
    ta.start()
    assert a_drawing.wait(timeout=30)  # A has written results.json and is drawing its plots
    tb.start()
    ta.join()
    tb.join()
    results_suite = json.loads((tmp_path / "results.json").read_text())["suite"]
    report = (tmp_path / markdown.REPORT_NAME).read_text()
    return results_suite, "run-a" if "**suite** `run-a`" in report else "run-b"


def test_the_folder_holds_one_runs_files(tmp_path, monkeypatch) -> None:
    results_suite, report_suite = _write_both(tmp_path, monkeypatch)
    assert results_suite == report_suite  # B waited for A (or A for B), then replaced all of its files


def test_without_the_lock_the_same_overlap_leaves_a_mix(tmp_path, monkeypatch) -> None:
    """The test above can fail: with the lock made a no-op, B's results sit beside A's report."""
    monkeypatch.setattr(report_folder, "locked", lambda folder: contextlib.nullcontext())
    assert _write_both(tmp_path, monkeypatch) == ("run-b", "run-a")
