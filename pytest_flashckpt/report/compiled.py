"""Compiled scenarios (``compile.scope`` block or model; docs/compile.md): how each was compiled, what compiling
cost apart from the step, and the recompilations after its warm-up, flagged. Empty (no section) when no compiled
scenario ran, so an eager report reads as before."""

from __future__ import annotations

from pytest_flashckpt.core.result import Result
from pytest_flashckpt.report import select
from pytest_flashckpt.report.format import MISSING, metric, mib, pct, spread
from pytest_flashckpt.report.tables import Footnotes, table

HEADERS = ["scenario", "model", "strategy", "seq", "peak memory", "memory saving", "overhead (min-max)",
           "compile (first step)", "reference compile", "compiled regions / step", "recompiles after warm-up"]

RECOMPILED = "**{n} (flagged)**"


def compiled_results(results: list[Result]) -> list[Result]:
    return [r for r in results if getattr(r.config, "compile", None) is not None and r.config.compile.enabled]


def _row(r: Result, notes: Footnotes) -> list[str]:
    head = [f"`{r.id}`", select.card(r), select.describe_activation(r), str(r.config.seq_len)]
    if r.status != "measured":
        return [*head, notes.skipped(r.status, r.reason), *[MISSING] * 6]
    m = r.metrics
    num = lambda k: m.get(k) if isinstance(m.get(k), (int, float)) else None  # noqa: E731
    recompiles = num("recompiles")
    flagged = MISSING if recompiles is None else (RECOMPILED.format(n=recompiles) if recompiles else "0")
    timed = lambda k: MISSING if num(k) is None else metric(k, num(k))  # noqa: E731
    return [*head, mib(num("peak_bytes")), pct(num("memory_saving")),
            spread(num("overhead"), num("overhead_min"), num("overhead_max")),
            timed("compile_time_s"), timed("reference_compile_time_s"),
            MISSING if num("compiled_regions") is None else str(num("compiled_regions")), flagged]


def compiled_section(results: list[Result]) -> list[str]:
    chosen = compiled_results(results)
    if not chosen:
        return []
    notes = Footnotes()
    rows = [_row(r, notes) for r in chosen]
    sources = sorted({str(r.metrics["peak_memory_source"]) for r in chosen if r.metrics.get("peak_memory_source")})
    return [
        "## Compiled steps (torch.compile)", "",
        table(rows, HEADERS), *notes.lines(), "",
        "Each row and its reference (no checkpointing) are compiled the same way in this run, so memory saving and "
        "overhead compare compiled with compiled. Compile = wall time of the first step (Dynamo and Inductor, forward "
        "and backward), apart from the step time. A recompile after the warm-up is flagged: that row's peak and times "
        "include compiling. Peak memory: " + ("; ".join(sources) or "the run's probe") + " (docs/compile.md).",
    ]
