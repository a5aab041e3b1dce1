"""Compiled scenarios (``compile.scope`` block or model; docs/compile.md): how each was compiled, what compiling
cost apart from the step, and the recompilations after its warm-up, flagged. Empty (no section) when no compiled
scenario ran, so an eager report reads as before."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pytest_flashckpt.core.result import Result, RunRecord
from pytest_flashckpt.report import select
from pytest_flashckpt.report.header import wall_time_text
from pytest_flashckpt.report.format import MISSING, metric, mib, pct, spread
from pytest_flashckpt.report.tables import Footnotes, table

HEADERS = ["scenario", "model", "strategy", "seq", "peak memory", "simulated peak", "simulated - measured",
           "memory saving", "overhead (min-max)", "compile (first step)", "reference compile",
           "compiled regions / step", "recompiles after warm-up"]

RECOMPILED = "**{n} (flagged)**"
NOT_SIMULATED = "compiled simulation: not simulated: "  # a row's note (runner.run), shown as the row's footnote
SIM_BOUND = 0.05  # issue 33: simulated within 5% of the allocator's peak, a bound fixed before measuring


@dataclass(frozen=True)
class Included:
    """Another run whose compiled rows a report shows (``RunRecord.included``): its record, or why it could not be
    read, and the path of its report relative to the report that includes it."""

    path: str  # as recorded: relative to the including run's results file
    report_link: str
    record: RunRecord | None = None
    error: str | None = None


def read_included(paths: list[str], base: Path, out_dir: Path) -> list[Included]:
    """Each of ``paths`` (relative to ``base``) read; one that cannot be read (moved, deleted) is kept with the reason,
    so a re-rendered report says so instead of failing. Links are relative to ``out_dir``, where the report goes."""
    from pytest_flashckpt.config.record_file import read_record

    out = []
    for path in paths:
        file = (base / path).resolve()
        link = os.path.relpath(file.parent / "flashckpt-report.md", Path(out_dir).resolve())
        try:
            out.append(Included(path, link, record=read_record(file)))
        except ValueError as exc:
            out.append(Included(path, link, error=str(exc)))
    return out


def _included_line(inc: Included) -> str:
    if inc.record is None:
        return f"- `{inc.path}`: not read ({inc.error})"
    r = inc.record
    measured = len([x for x in compiled_results(r.results) if x.status == "measured"])
    return (f"- suite `{r.suite}` ([{inc.report_link}]({inc.report_link})): {measured} compiled row(s) measured, profile "
            f"`{r.profile_id}`, run {r.created}, commit `{r.commit or 'unknown'}`{wall_time_text(r.wall_time_s, r.cpu_time_s)}")


def compiled_results(results: list[Result]) -> list[Result]:
    return [r for r in results if getattr(r.config, "compile", None) is not None and r.config.compile.enabled]


def _row(r: Result, notes: Footnotes) -> list[str]:
    head = [f"`{r.id}`", select.card(r), select.describe_activation(r), str(r.config.seq_len)]
    if r.status != "measured":
        return [*head, notes.skipped(r.status, r.reason), *[MISSING] * 8]
    m = r.metrics
    num = lambda k: m.get(k) if isinstance(m.get(k), (int, float)) else None  # noqa: E731
    recompiles = num("recompiles")
    flagged = MISSING if recompiles is None else (RECOMPILED.format(n=recompiles) if recompiles else "0")
    timed = lambda k: MISSING if num(k) is None else metric(k, num(k))  # noqa: E731
    return [*head, mib(num("peak_bytes")), *_simulated(r, notes), pct(num("memory_saving")),
            spread(num("overhead"), num("overhead_min"), num("overhead_max")),
            timed("compile_time_s"), timed("reference_compile_time_s"),
            MISSING if num("compiled_regions") is None else str(num("compiled_regions")), flagged]


def simulated_gap(r: Result) -> tuple[int, float] | None:
    """(simulated - measured bytes, that over measured) of a row the compiled-step simulator ran on, else None."""
    measured, simulated = r.metrics.get("peak_bytes"), r.metrics.get("compiled_simulated_peak_bytes")
    if not isinstance(measured, (int, float)) or not isinstance(simulated, (int, float)) or not measured:
        return None
    return int(simulated - measured), (simulated - measured) / measured


def _simulated(r: Result, notes: Footnotes) -> list[str]:
    gap = simulated_gap(r)
    if gap is not None:
        within = "within" if abs(gap[1]) <= SIM_BOUND else "**outside**"
        return [mib(r.metrics["compiled_simulated_peak_bytes"]), f"{gap[0]:+,} B ({gap[1]:+.2%}, {within} {SIM_BOUND:.0%})"]  # type: ignore[arg-type]
    why = next((n[len(NOT_SIMULATED):] for n in r.notes if n.startswith(NOT_SIMULATED)), None)
    return [f"not simulated {notes.mark(why)}" if why else MISSING, MISSING]


def compiled_section(results: list[Result], included: list[Included] | None = None) -> list[str]:
    """The section over this run's compiled rows and those of the ``included`` runs (after this run's), with a line
    per included run saying where its rows come from."""
    included = included or []
    chosen = compiled_results(results) + [r for inc in included if inc.record for r in compiled_results(inc.record.results)]
    if not chosen and not included:
        return []
    notes = Footnotes()
    rows = [_row(r, notes) for r in chosen]
    sources = sorted({str(r.metrics["peak_memory_source"]) for r in chosen if r.metrics.get("peak_memory_source")})
    origin = []
    if included:
        origin = ["Rows from other runs, included by `--flashckpt-include` (measured there, shown here as they were, "
                  "not gated by this run's baseline):", "", *(_included_line(inc) for inc in included), ""]
    return [
        "## Compiled steps (torch.compile)", "", *origin,
        table(rows, HEADERS) if rows else "_No compiled row could be read._", *notes.lines(), "",
        "Each row and its reference (no checkpointing) are compiled the same way in this run, so memory saving and "
        "overhead compare compiled with compiled. Compile = wall time of the first step (Dynamo and Inductor, forward "
        "and backward), apart from the step time. A recompile after the warm-up is flagged: that row's peak and times "
        "include compiling. Peak memory: " + ("; ".join(sources) or "the run's probe") + " (docs/compile.md). "
        "Simulated peak: the same compiled step on fake tensors (`simulate.compiled`: torch's Dynamo, partitioner and "
        f"Inductor's memory plan, no kernel run), training state included; the bound is {SIM_BOUND:.0%} of the measured "
        "peak (reports/compiled-sim-vs-measured.md names the gaps: 0-dim AdamW tensors, CPU flash attention's scratch).",
    ]
