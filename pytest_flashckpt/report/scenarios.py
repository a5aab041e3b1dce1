"""Every scenario of the run in one table, including those skipped (with the reason, in full)."""

from __future__ import annotations

from pytest_flashckpt.report import select
from pytest_flashckpt.report.format import MISSING, mib, ms, pct, spread
from pytest_flashckpt.report.tables import escape, table
from pytest_flashckpt.core.result import Result

HEADERS = ["scenario", "strategies", "precision", "kernel", "seq", "peak memory", "memory saving", "step time", "overhead (min-max)", "save stall", "status"]


def _row(r: Result) -> list[str]:
    head = [f"`{r.id}`", select.describe_strategies(r), select.precision(r)]
    if r.status != "measured":
        return [*head, MISSING, str(r.config.seq_len), *[MISSING] * 5, escape(f"{r.status}: {r.reason or 'no reason given'}")]
    return [
        *head, f"`{r.kernel}`" if r.kernel else MISSING, str(r.config.seq_len),
        mib(r.number("peak_bytes")), pct(r.number("memory_saving")), ms(r.number("step_time_s")),
        spread(r.number("overhead"), r.number("overhead_min"), r.number("overhead_max")), ms(r.number("save_stall_s")),
        "simulated (see Will it fit?)" if select.simulated(r) else "measured",
    ]


def scenarios_section(results: list[Result]) -> list[str]:
    lines = ["## All scenarios", ""]
    if not results:
        lines.append("_No scenario ran._")
        return lines
    lines.append(table([_row(r) for r in results], HEADERS))
    return lines
