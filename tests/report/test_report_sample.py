"""The committed sample report (reports/sample/flashckpt-report.md) is what its committed results.json renders:
byte for byte, except a new column the sample has no metric for yet, shown absent in every row (``sample_check``).
Adding a metric with a report column therefore needs no hand-regenerated sample; changing what an existing
column, heading or line shows still fails until the sample is regenerated."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from sample_check import sample_problem

from pytest_flashckpt.config.record_file import read_record
from pytest_flashckpt.report import checkpoint_io, render, write_report
from pytest_flashckpt.report.compiled import read_included
from pytest_flashckpt.report.plots import write_plots

SAMPLE = Path(__file__).resolve().parents[2] / "reports" / "sample"


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """The committed record, its committed report and its plots (drawn once: 3 s)."""
    record = read_record(SAMPLE / "results.json")
    plots = write_plots(record, tmp_path_factory.mktemp("sample"))  # what write_report renders the report with
    included = read_included(record.included, SAMPLE, SAMPLE)  # the compiled suite's run, as write_report reads it
    return record, plots, (SAMPLE / "flashckpt-report.md").read_text(encoding="utf-8"), included


def _with_io_column(monkeypatch, metric: str) -> None:
    """A scratch column after "files" in the checkpoint I/O table, reading ``metric`` (as a new column would)."""
    rows, headers = checkpoint_io._rows, checkpoint_io.IO_HEADERS

    def with_column(r, notes):
        timing, io = rows(r, notes)
        return timing, [*io[:3], checkpoint_io.mib(r.number(metric)), *io[3:]]

    monkeypatch.setattr(checkpoint_io, "_rows", with_column)
    monkeypatch.setattr(checkpoint_io, "IO_HEADERS", [*headers[:3], "scratch per file", *headers[3:]])


@pytest.mark.slow
def test_the_committed_sample_renders_the_committed_report(sample, tmp_path) -> None:
    """The runs the sample includes (``--flashckpt-include``: the compiled suite's) are copied to the same places
    beside the rendered copy, so their links read as committed."""
    import os
    import shutil

    record, _, committed, _ = sample
    out = tmp_path / "reports" / "sample"
    for path in record.included:
        target = Path(os.path.normpath(out / path))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SAMPLE / path, target)
    problem, _ = sample_problem(write_report(record, out).read_text(encoding="utf-8"), committed)
    assert problem is None, problem


@pytest.mark.slow
def test_a_new_column_the_sample_has_no_metric_for_is_tolerated(sample, monkeypatch) -> None:
    record, plots, committed, included = sample
    _with_io_column(monkeypatch, "scratch_bytes_per_file")  # no result of the committed sample has it
    rendered = render(record, plots, included)
    assert "| scratch per file " in rendered and rendered != committed  # the column is really there, shown absent
    problem, tolerated = sample_problem(rendered, committed)
    assert problem is None and "'scratch per file' (table 'scenario'...)" in tolerated, problem


def test_a_new_column_that_shows_a_value_fails(sample, monkeypatch) -> None:  # control: the sample can't have it
    record, plots, committed, included = sample
    _with_io_column(monkeypatch, "bytes_written")
    problem, _ = sample_problem(render(record, plots, included), committed)
    assert problem and "show a value the committed sample cannot have" in problem and "scratch per file" in problem


@pytest.mark.parametrize("with_new_column", [False, True], ids=["alone", "beside-a-new-column"])
def test_a_changed_number_in_an_existing_column_still_fails(sample, monkeypatch, with_new_column) -> None:
    record, plots, committed, included = sample
    record = copy.deepcopy(record)
    changed = next(r for r in record.results if r.number("files") is not None)
    changed.metrics["files"] = changed.number("files") + 1
    if with_new_column:
        _with_io_column(monkeypatch, "scratch_bytes_per_file")
    problem, _ = sample_problem(render(record, plots, included), committed)
    assert problem and "a table row changed" in problem and changed.id in problem, problem


def test_a_renamed_header_or_a_changed_line_fails(sample) -> None:
    committed = sample[2]
    assert sample_problem(committed, committed) == (None, [])
    io_header = next(line for line in committed.split("\n") if line.startswith("| scenario") and "| files " in line)
    renamed = committed.replace(io_header, io_header.replace("| files ", "| filez "))
    assert "table headers changed" in sample_problem(renamed, committed)[0]
    line = next(line for line in committed.split("\n") if line.startswith("Stall = "))
    assert "changed" in sample_problem(committed.replace(line, line + "!"), committed)[0]
    assert "blocks" in sample_problem(committed + "\nmore", committed)[0]
