"""The markdown report written by every suite run: sections in reading order, plots beside the file.

``write_report(record, out_dir)`` is what the suite session and ``flashckpt report`` call; ``render`` is pure
(record -> text) so tests and ``flashckpt compare`` need no files. Every section says in one line when this run
has no data for it, so a missing table is never a silent omission.
"""

from __future__ import annotations

from pathlib import Path

from pytest_flashckpt.core.claims import CLAIMS
from pytest_flashckpt.core.files import atomic_write_text
from pytest_flashckpt.report import select
from pytest_flashckpt.report.activation import activation_section
from pytest_flashckpt.report.article import article_table, single_claim
from pytest_flashckpt.report.attention import attention_section
from pytest_flashckpt.report.checkpoint_io import checkpoint_section
from pytest_flashckpt.report.distributed import distributed_section
from pytest_flashckpt.report.format import mib, ms, pct, ratio
from pytest_flashckpt.report.header import header
from pytest_flashckpt.report.plots import Plot, write_plots
from pytest_flashckpt.report.regression import regression_section
from pytest_flashckpt.report.scenarios import scenarios_section
from pytest_flashckpt.report.claim_verdicts import judge
from pytest_flashckpt.report.simulation import simulation_section
from pytest_flashckpt.report.throughput import throughput_section
from pytest_flashckpt.core.result import Result, RunRecord

REPORT_NAME = "flashckpt-report.md"


def _plot(plots: dict[str, Plot] | None, key: str) -> list[str]:
    if plots is None:
        return ["", "_Plots are drawn only when the report is written to a folder._"]
    return ["", plots[key].markdown()]


def render(record: RunRecord, plots: dict[str, Plot] | None = None) -> str:
    results = record.results
    sections = [
        header(record),
        article_table(record),
        single_claim(record),
        activation_section(results) + _plot(plots, "pareto"),
        attention_section(results) + _plot(plots, "attention"),
        throughput_section(results) + _plot(plots, "throughput"),
        checkpoint_section(results) + _plot(plots, "saves"),
        distributed_section(results),
        simulation_section(results),
        regression_section(record.comparison),
        scenarios_section(results),
    ]
    return "\n\n".join("\n".join(lines) for lines in sections) + "\n"


def write_report(record: RunRecord, out_dir: Path) -> Path:
    """Write ``flashckpt-report.md`` and its PNGs into ``out_dir`` (atomically: a reader never sees half a file)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = write_plots(record, out_dir)
    path = out_dir / REPORT_NAME
    atomic_write_text(path, render(record, plots))
    return path


def _article_lines(results: list[Result]) -> list[str]:
    out = []
    for tag, tagged in select.by_article(results).items():
        claim = CLAIMS.get(tag)
        for r in tagged:
            if claim is None:
                out.append(f"article {tag!r} ({r.id}): no such claim; known: {', '.join(CLAIMS)}")
                continue
            verdict = judge(claim, r)
            out.append(f"article {claim.title} ({r.id}): {verdict.word} ({verdict.reason})")
    return out


def summary_lines(results: list[Result]) -> list[str]:
    """Short terminal summary: one line per scenario, then one per article claim tested."""
    out = []
    for r in results:
        if r.status != "measured":
            out.append(f"{r.id}: {r.status} ({r.reason})")
            continue
        m = r.metrics
        parts = [f"kernel {r.kernel}"]
        if isinstance(m.get("peak_bytes"), (int, float)):
            parts.append(f"peak {mib(m['peak_bytes'])}")  # type: ignore[arg-type]
        if isinstance(m.get("simulated_peak_bytes"), (int, float)):  # simulate suite: a prediction, marked as such
            parts.append(f"simulated peak {mib(m['simulated_peak_bytes'])}")  # type: ignore[arg-type]
        if isinstance(m.get("memory_saving"), (int, float)):
            parts.append(f"saving {pct(m['memory_saving'])}")  # type: ignore[arg-type]
        if isinstance(m.get("step_time_s"), (int, float)):
            parts.append(f"step {ms(m['step_time_s'])}")  # type: ignore[arg-type]
        if isinstance(m.get("overhead"), (int, float)):
            parts.append(f"overhead {ratio(m['overhead'])}")  # type: ignore[arg-type]
        if isinstance(m.get("save_stall_s"), (int, float)):
            parts.append(f"stall {ms(m['save_stall_s'])}")  # type: ignore[arg-type]
        out.append(f"{r.id}: " + ", ".join(parts))
    return out + _article_lines(results)
