"""Activation strategies: what each saves and what it costs, with the spread over rounds, the FLOP ratio (an
independent check on the recompute: one extra forward ~ +33%), and the analytic estimate where the runner
recorded one (metrics named ``analytic_*``; a family without an analytic model shows "—"). The model column
names the card, so each row's family (GPT's ``tiny``, ``llama-tiny``) is on the row."""

from __future__ import annotations

from pytest_flashckpt.report import select
from pytest_flashckpt.report.format import MISSING, metric, mib, pct, ratio, spread
from pytest_flashckpt.report.tables import Footnotes, table
from pytest_flashckpt.core.result import Result

HEADERS = [
    "scenario", "model", "strategy", "precision", "kernel", "seq", "peak memory", "reference peak", "memory saving",
    "overhead (min-max)", "FLOP ratio", "analytic estimate",
]


def analytic(r: Result) -> str:
    """Every ``analytic_*`` metric, formatted by its unit: ``peak 120.0 MiB; saving 61.0%``."""
    parts = [
        f"{name.removeprefix('analytic_').replace('_', ' ')} {metric(name, value)}"
        for name, value in sorted(r.metrics.items())
        if name.startswith("analytic_") and value is not None
    ]
    return "; ".join(parts) or MISSING


def _row(r: Result, notes: Footnotes) -> list[str]:
    head = [f"`{r.id}`", select.card(r), select.describe_activation(r), select.precision(r)]
    if r.status != "measured":
        return [*head, notes.skipped(r.status, r.reason), str(r.config.seq_len)]  # table() fills the rest
    m = r.metrics
    num = lambda k: m.get(k) if isinstance(m.get(k), (int, float)) else None  # noqa: E731
    return [
        *head, f"`{r.kernel}`" if r.kernel else MISSING, str(r.config.seq_len),
        mib(num("peak_bytes")), mib(num("reference_peak_bytes")), pct(num("memory_saving")),
        spread(num("overhead"), num("overhead_min"), num("overhead_max")), ratio(num("flop_ratio")), analytic(r),
    ]


def activation_section(results: list[Result]) -> list[str]:
    lines = ["## Activation checkpointing strategies", ""]
    chosen = select.activation_results(results)
    if not chosen:
        lines.append("_No activation-checkpointing scenario (activation strategy other than `none`) ran in this suite._")
        return lines
    notes = Footnotes()
    rows = [_row(r, notes) for r in chosen]
    lines += [
        table(rows, HEADERS),
        *notes.lines(),
        "",
        "Memory saving = 1 - peak / reference peak (same model, kernel, batch and sequence, no checkpointing, "
        "measured in this run). Overhead = median of per-round step-time ratios, min-max over the rounds in "
        "brackets. FLOP ratio = counted FLOPs of one step / the reference's.",
    ]
    return lines
