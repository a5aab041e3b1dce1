"""What a suite run prints in a terminal: one line per scenario as it finishes, and the end-of-run summary (the
article's table, the verdicts that are not ``ok``, where the report is). The pytest plugin prints these through
pytest's terminal reporter (honouring ``-q``/``-v``); ``flashckpt run`` prints them to standard output.
The markdown report is ``report.markdown``; both read the same data (``report.article.article_rows``)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from tabulate import tabulate

from pytest_flashckpt.core.comparison import VERDICT_ORDER, Comparison, RegressionVerdict
from pytest_flashckpt.core.numbers import raw as fmt, relative_change as fmt_change
from pytest_flashckpt.report.article import article_rows
from pytest_flashckpt.report.format import mib, ms, pct, ratio
from pytest_flashckpt.core.result import Result, RunRecord

WIDTH = 100  # terminal lines are wrapped to this many characters

STATUS_VERDICT = {"no-baseline": "no baseline", "other-profile": "other profile's baseline", "disabled": "not compared"}


def scenario_verdict(result: Result, rows: Sequence[RegressionVerdict] | None, gate_status: str | None) -> str:
    """One word for a finished scenario: its worst regression verdict (regressed, improved, ~, ok), or why there
    is none (skipped, error, no baseline, not in the baseline, not compared)."""
    if result.status != "measured":
        return result.status
    words = {r.verdict for r in rows or ()}
    for word in VERDICT_ORDER:
        if word in words:
            return word
    if gate_status == "compared":
        return "not in the baseline"
    return STATUS_VERDICT.get(gate_status or "", "not compared")


def metric_parts(r: Result, compact: bool = False) -> list[str]:
    """The headline numbers of a measured result: kernel, peak, saving, overhead or step time, MFU and HFU (of the
    datasheet peak, else of the measured matmul roofline), save stall."""
    num = r.number

    parts = [] if compact else [f"kernel {r.kernel or '?'}"]
    if num("peak_bytes") is not None:
        parts.append(f"peak {mib(num('peak_bytes'))}")
    if num("simulated_peak_bytes") is not None:  # simulate suite: a prediction, marked as such
        parts.append(f"simulated peak {mib(num('simulated_peak_bytes'))}")
    if num("memory_saving") is not None:
        parts.append(f"saving {pct(num('memory_saving'))}")
    if num("overhead") is not None:
        parts.append(f"overhead {ratio(num('overhead'))}")
    elif num("step_time_s") is not None and not compact:
        parts.append(f"step {ms(num('step_time_s'))}")
    if not compact and num("mfu") is not None:  # against the datasheet peak where there is one
        parts.append(f"MFU {pct(num('mfu'))} (HFU {pct(num('hfu'))})")
    elif not compact and num("mfu_roofline") is not None:  # a CPU, or a GPU missing from the peak table
        parts.append(f"MFU {pct(num('mfu_roofline'))} of roofline (HFU {pct(num('hfu_roofline'))})")
    if num("save_stall_s") is not None:
        parts.append(f"stall {ms(num('save_stall_s'))}")
    return parts


def scenario_line(r: Result, verdict: str | None = None, compact: bool = False) -> str:
    """``suite::name: kernel cpu_flash, peak 41.2 MiB, saving 38.0%, overhead 1.27x -> ok`` (compact: fewer
    numbers); a skipped or broken scenario shows its reason's first line."""
    if r.status != "measured":
        reason = (r.reason or "no reason given").splitlines()[0]
        return _clip(f"{r.id}: {r.status} ({reason})")
    line = f"{r.id}: " + ", ".join(metric_parts(r, compact))
    return line + (f" -> {verdict}" if verdict else "")


def _clip(line: str, width: int = WIDTH) -> str:
    return line if len(line) <= width else line[: width - 3] + "..."


def article_lines(record: RunRecord) -> list[str]:
    """The article's table (claims, what measured them, claimed vs measured, verdict word) as a plain table; none
    when no scenario of the run tests a claim."""
    found = article_rows(record)
    if not any(row.result is not None for row in found):
        return []  # no scenario of this suite tests a claim: a table of "nothing" rows would be noise
    rows = []
    for row in found:
        by = row.result.scenario if row.result is not None else "nothing"
        rows.append([
            row.claim.title, by, f"{row.claim.describe_saving()} / {row.measured_saving}",
            f"{row.claim.describe_overhead()} / {row.measured_overhead}", row.verdict.word,
        ])
    headers = ["claim", "measured by", "saving claimed / measured", "overhead claimed / measured", "verdict"]
    return ["the article's claims (details and reasons in the report):",
            *tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True).splitlines()]


def wrap(text: str, indent: str = "  ", width: int = WIDTH) -> list[str]:
    """A long message as short lines: one per ``; ``-separated part, each wrapped to ``width``."""
    out = []
    for part in (p.strip() for p in text.split("; ")):
        if part:
            out += _paragraph(part, indent, width)
    return out


def _paragraph(text: str, indent: str = "  ", width: int = WIDTH) -> list[str]:
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  ", break_on_hyphens=False)


def regression_lines(comparison: Comparison | None) -> list[str]:
    """The baseline verdicts, short: counts, then each verdict that is not ``ok``, then the notes, wrapped."""
    if comparison is None:
        return []
    notes = [line for note in comparison.notes for line in _paragraph(note.text)]
    if comparison.status != "compared":
        return ["baseline:" + (" WARNING" if comparison.status == "other-profile" else ""), *wrap(comparison.message or ""), *notes]
    counts = ", ".join(f"{n} {word}" for word, n in comparison.counts().items() if n) or "nothing compared"
    lines = [f"baseline {comparison.baseline_path or '(unreadable)'}: {counts}"]
    ordered = sorted((v for v in comparison.verdicts if v.verdict != "ok"), key=lambda v: (VERDICT_ORDER.index(v.verdict), v.scenario, v.metric))
    for v in ordered:
        p = f", p={v.p_value:.3g}" if v.p_value is not None else ""
        if v.verdict == "missing":
            text = f"  {v.verdict:>9} {v.scenario} {v.metric}: {getattr(v, 'reason', '') or 'not measured in this run'}"
        else:
            text = f"  {v.verdict:>9} {v.scenario} {v.metric}: {fmt(v.baseline)} -> {fmt(v.current)} ({fmt_change(v.change) or 'n/a'}{p})"
        lines.append(_clip(text))
    lines += notes  # the counts line above says what the message says
    if any(v.verdict == "improved" for v in comparison.verdicts):
        lines.append("  improvements found: refresh the baseline with --flashckpt-save-baseline to guard them")
    return lines


def where_lines(report: str, results: str, baseline_saved: str | None = None, step_summary: str | None = None) -> list[str]:
    """Where the run's files are (paths as the user should type them: relative to the invocation folder)."""
    lines = [f"report: {report} (results: {results})"]
    if baseline_saved is not None:
        lines.append(f"baseline saved: {baseline_saved}")
    if step_summary is not None:
        lines.append(f"verdicts appended to $GITHUB_STEP_SUMMARY ({step_summary})")
    return lines


class Heartbeat:
    """Decides when a running scenario's phase is worth a line: when more than ``interval`` seconds passed since
    the last line printed (``printed()`` marks one), so a long scenario never leaves the terminal silent."""

    def __init__(self, interval: float = 5.0, clock=None) -> None:
        import time

        self.interval = interval
        self.clock = clock or time.monotonic
        self.last = self.clock()

    def printed(self) -> None:
        self.last = self.clock()

    def due(self) -> bool:
        if self.clock() - self.last > self.interval:
            self.last = self.clock()
            return True
        return False
