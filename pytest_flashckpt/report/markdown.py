"""The markdown report written by every suite run: sections in reading order, plots beside the file.

``write_report(record, out_dir)`` is what the suite session and ``flashckpt report`` call; ``render`` is pure
(record -> text) so tests and ``flashckpt compare`` need no files. Every section says in one line when this run
has no data for it, so a missing table is never a silent omission.
"""

from __future__ import annotations

from pathlib import Path

from pytest_flashckpt.core.files import atomic_write_text
from pytest_flashckpt.report.activation import activation_section
from pytest_flashckpt.report.article import article_table, single_claim
from pytest_flashckpt.report.attention import attention_section
from pytest_flashckpt.report.checkpoint_io import checkpoint_section
from pytest_flashckpt.report.compiled import Included, compiled_section, read_included
from pytest_flashckpt.report.distributed import distributed_section
from pytest_flashckpt.report.header import header
from pytest_flashckpt.report.plots import Plot, write_plots
from pytest_flashckpt.report.regression import regression_section
from pytest_flashckpt.report.scenarios import scenarios_section
from pytest_flashckpt.report.simulation import simulation_section
from pytest_flashckpt.report.throughput import throughput_section
from pytest_flashckpt.core.result import RunRecord

REPORT_NAME = "flashckpt-report.md"


def _plot(plots: dict[str, Plot] | None, key: str) -> list[str]:
    if plots is None:
        return ["", "_Plots are drawn only when the report is written to a folder._"]
    return ["", plots[key].markdown()]


def render(record: RunRecord, plots: dict[str, Plot] | None = None, included: list[Included] | None = None) -> str:
    """The report's text; ``included``: the other runs ``record.included`` names, read (``read_included``)."""
    results = record.results
    sections = [
        header(record),
        article_table(record),
        single_claim(record),
        activation_section(results) + _plot(plots, "pareto"),
        compiled_section(results, included or []),  # empty (left out) without compiled rows, own or included
        attention_section(results) + _plot(plots, "attention"),
        throughput_section(results) + _plot(plots, "throughput"),
        checkpoint_section(results) + _plot(plots, "saves"),
        distributed_section(results),
        simulation_section(results),
        regression_section(record.comparison),
        scenarios_section(results),
    ]
    return "\n\n".join("\n".join(lines) for lines in sections if lines) + "\n"


def write_report(record: RunRecord, out_dir: Path, base: Path | None = None) -> Path:
    """Write ``flashckpt-report.md`` and its PNGs into ``out_dir`` (atomically: a reader never sees half a file).
    ``base``: the folder ``record.included`` is relative to (its results file's; default ``out_dir``)."""
    out_dir = Path(out_dir)
    included = read_included(record.included, Path(base) if base is not None else out_dir, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = write_plots(record, out_dir)
    path = out_dir / REPORT_NAME
    atomic_write_text(path, render(record, plots, included))
    return path
