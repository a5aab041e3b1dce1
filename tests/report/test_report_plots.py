"""Plots: drawn when their data exists, skipped with the reason when not; matplotlib loaded lazily."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import report_synthetic as syn

from pytest_flashckpt.report import REPORT_NAME, write_report
from pytest_flashckpt.report.plots import ATTENTION, PARETO, SAVES, THROUGHPUT
from pytest_flashckpt.core.result import RunRecord

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_plots_written_and_linked(record: RunRecord, tmp_path: Path) -> None:
    """All three plots (the slowest test here: matplotlib draws three figures)."""
    path = write_report(record, tmp_path)
    text = path.read_text(encoding="utf-8")
    for name in (PARETO, ATTENTION, SAVES):
        assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC)
        assert f"]({name})" in text
    assert path.name == REPORT_NAME
    assert not list(tmp_path.glob("*.tmp"))


def test_plots_skipped_with_reason_and_stale_ones_removed(tmp_path: Path) -> None:
    for name in (PARETO, ATTENTION, SAVES, THROUGHPUT):
        (tmp_path / name).write_bytes(PNG_MAGIC)  # left over from an earlier run
    text = write_report(syn.record([]), tmp_path).read_text(encoding="utf-8")
    for name in (PARETO, ATTENTION, SAVES, THROUGHPUT):
        assert not (tmp_path / name).exists()
    assert text.count("not drawn:") == 4
    assert "no activation-checkpointing scenario measured both memory saving and overhead" in text


def test_only_the_plots_with_data(tmp_path: Path) -> None:
    attention_only = [r for r in syn.results() if r.config.activation.strategy == "none" and r.config.save.strategy == "none"]
    text = write_report(syn.record(attention_only), tmp_path).read_text(encoding="utf-8")
    assert (tmp_path / ATTENTION).exists() and not (tmp_path / PARETO).exists() and not (tmp_path / SAVES).exists()
    assert "no scenario with a save strategy was measured" in text


@pytest.mark.slow
def test_matplotlib_is_not_imported_with_the_report_package() -> None:
    code = "import sys, pytest_flashckpt.report, pytest_flashckpt.cli; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_single_points_and_zero_times_draw(tmp_path: Path) -> None:
    """Degenerate data (one sequence length, one strategy, an instant save) draws without warnings."""
    from pytest_flashckpt.config.scenario import ActivationConfig, SaveConfig

    one = [
        syn.attention("sdpa", 512, 60),
        syn.strategy("p", 0.3, 1.0, ActivationConfig("full"), SaveConfig(strategy="async"), **syn.save_metrics(0.0, 0.0)),
    ]
    write_report(syn.record(one), tmp_path)
    assert all((tmp_path / name).exists() for name in (PARETO, ATTENTION, SAVES))
