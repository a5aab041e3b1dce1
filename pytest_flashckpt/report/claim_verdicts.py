"""Verdicts on the article's claims: does a measured result bear the claim out?

A claim has two parts, a memory saving ("~30%") and an overhead ("low"), and a table row a third, its save half
(``claims.SaveCriterion``). Each part is judged on its own:

- saving: holds when ``|measured - claimed| <= tolerance`` (10 percentage points, ``claims.SAVING_TOLERANCE``);
- overhead, symmetrically on the rounds' min-max interval: holds when the whole interval lies in the claim's band
  (``claims.OVERHEAD_BANDS``), misses when the whole interval lies outside it, and is not measurable when the
  interval straddles a band edge (the rounds disagree; more rounds or a quieter machine would tell);
- save: the row's criterion on the median save (async stall share, bytes vs a full save, deferrals).

The verdict on one workload: **does not hold** when any measured part misses; **not measurable** when nothing
misses but a part could not be measured (scenario skipped, metric absent, interval straddling: the reason says
which); **holds** when every part was measured and holds. A claim tested over several workloads (``judge_row``)
is stated as a count and a range: "holds on 2 of 3 (saving 41-58%)".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pytest_flashckpt.core.claims import MIN_WORKLOADS, Claim, OverheadBand
from pytest_flashckpt.report.format import pct, ratio
from pytest_flashckpt.core.result import Result

ClaimWord = Literal["holds", "does not hold", "not measurable"]  # a claim's verdict (regression words: core.comparison.VerdictWord)


@dataclass(frozen=True)
class Verdict:
    word: ClaimWord
    reason: str

    def cell(self) -> str:
        """Markdown table cell: the word in bold, then why."""
        return f"**{self.word}**: {self.reason}" if self.reason else f"**{self.word}**"


@dataclass(frozen=True)
class PartVerdict:
    """One part of a claim: ``ok`` True / False when measured, None when it could not be."""

    ok: bool | None
    text: str


def judge_saving(claim: Claim, result: Result) -> PartVerdict:
    value = result.number("memory_saving")
    if value is None:
        why = "the scenario did not measure memory" if "memory" not in result.config.measure else (
            "no memory saving recorded (a reference scenario, or no reference peak)"
        )
        return PartVerdict(None, f"saving not measurable: {why}")
    gap = value - claim.saving
    within = abs(gap) <= claim.saving_tolerance + 1e-12
    side = "within" if within else ("above" if gap > 0 else "below")
    return PartVerdict(
        within,
        f"saving {pct(value)} is {side} {claim.describe_saving()} ± {claim.saving_tolerance * 100:.0f} pp",
    )


def judge_overhead(claim: Claim, result: Result) -> PartVerdict:
    value = result.number("overhead")
    if value is None:
        why = "the scenario did not measure timing" if "timing" not in result.config.measure else (
            "no overhead recorded (no reference timing)"
        )
        return PartVerdict(None, f"overhead not measurable: {why}")
    band = claim.overhead
    low, high = result.number("overhead_min"), result.number("overhead_max")
    if low is None or high is None:
        low = high = value
    rounds = f"{ratio(value)} (rounds {low:.2f}-{high:.2f})"
    if band.contains(low) and band.contains(high):
        return PartVerdict(True, f"overhead {rounds} is {claim.overhead_text} ({band.describe()})")
    if _overlaps(band, low, high):
        return PartVerdict(None, (
            f"overhead {rounds} straddles {claim.overhead_text} ({band.describe()}): the rounds disagree, not judged"
        ))
    side = "above" if band.high is not None and low > band.high else "below"
    return PartVerdict(False, f"overhead {rounds} is {side} {claim.overhead_text} ({band.describe()})")


def _overlaps(band: OverheadBand, low: float, high: float) -> bool:
    """Does the min-max range of the rounds reach into the band?"""
    return high > band.low and (band.high is None or low <= band.high)


def judge_save(claim: Claim, result: Result) -> PartVerdict | None:
    """The row's save criterion on the median save; None when the claim has no save half."""
    criterion = claim.save
    if criterion is None:
        return None
    number = result.number
    if "checkpoint" not in result.config.measure:
        return PartVerdict(None, "save not measurable: the scenario did not measure a save")
    if criterion.kind == "stall":
        share = number("stall_vs_sync")
        if share is None:
            return PartVerdict(None, "save not measurable: no stall_vs_sync (no reference sync save)")
        ok = share <= criterion.limit
        return PartVerdict(ok, f"save stall {pct(share)} of a sync save is {'within' if ok else 'above'} {criterion.limit:.0%}")
    if criterion.kind == "bytes":
        share = number("bytes_vs_full")
        if share is None:
            return PartVerdict(None, "save not measurable: no bytes_vs_full (no reference full save)")
        ok = share < criterion.limit
        return PartVerdict(ok, f"a save writes {pct(share)} of a full save's bytes{'' if ok else ': not fewer'}")
    deferrals, forced = number("deferrals"), number("forced_saves")
    if deferrals is None or forced is None:
        return PartVerdict(None, "save not measurable: no schedule recorded")
    ok = deferrals > 0 and forced == 0
    why = f"{int(deferrals)} deferrals, {int(forced)} saves forced above the threshold"
    return PartVerdict(ok, f"schedule: {why}" + ("" if ok else (" (never deferred)" if deferrals == 0 else "")))


def judge(claim: Claim, result: Result | None, missing: str | None = None) -> Verdict:
    """The verdict on ``claim`` from one result (None: no scenario tested it; ``missing`` says why)."""
    if result is None:
        return Verdict("not measurable", missing or f"no scenario with article: {claim.id} ran in this suite")
    if result.status == "skipped":
        return Verdict("not measurable", f"skipped on this hardware: {result.reason or 'no reason given'}")
    if result.status != "measured":
        return Verdict("not measurable", f"{result.status}: {result.reason or 'no reason given'}")
    parts = [judge_saving(claim, result), judge_overhead(claim, result)]
    save = judge_save(claim, result)
    if save is not None:
        parts.append(save)
    reason = "; ".join(p.text for p in parts)
    if any(p.ok is False for p in parts):
        return Verdict("does not hold", reason)
    if any(p.ok is None for p in parts):
        return Verdict("not measurable", reason)
    return Verdict("holds", reason)


@dataclass(frozen=True)
class RowVerdict:
    """A claim judged over several workloads: how many hold, the measured ranges, and each workload's verdict."""

    word: str  # "holds on k of n" (one workload: "holds" / "does not hold" / "not measurable")
    held: int
    judged: int  # workloads with a verdict other than not measurable
    total: int
    ranges: str  # "saving 41-58%; overhead 1.05-1.21x; ..."
    per_workload: tuple[tuple[str, Verdict], ...]

    def cell(self) -> str:
        unmeasured = self.total - self.judged
        extra = f", {unmeasured} not measurable" if unmeasured and self.judged else ""
        few = f"; only {self.total} workload{'s' if self.total != 1 else ''} (a row needs {MIN_WORKLOADS})" if self.total < MIN_WORKLOADS else ""
        return f"**{self.word}**{extra}{few}" + (f": {self.ranges}" if self.ranges else "")


def _span(values: list[float], scale: float, digits: int, unit: str) -> str:
    """``41-58%`` / ``1.05-1.21x``: the range over workloads, the unit written once."""
    low, high = f"{min(values) * scale:.{digits}f}", f"{max(values) * scale:.{digits}f}"
    return (low if low == high else f"{low}-{high}") + unit


def judge_row(claim: Claim, results: list[Result]) -> RowVerdict:
    """The claim over every workload that tested it: a count of those where it holds and the measured ranges."""
    verdicts = tuple((r.id, judge(claim, r)) for r in results)
    held = sum(v.word == "holds" for _, v in verdicts)
    judged = sum(v.word != "not measurable" for _, v in verdicts)
    measured = [r for r in results if r.status == "measured"]
    ranges = []
    save_kind = claim.save.kind if claim.save is not None else None
    for key, label, scale, digits, unit, needs in (
        ("memory_saving", "saving", 100, 0, "%", None),
        ("overhead", "overhead", 1, 2, "x", None),
        ("stall_vs_sync", "stall", 100, 0, "% of sync", "stall"),
        ("bytes_vs_full", "bytes", 100, 0, "% of full", "bytes"),
        ("deferrals", "deferrals", 1, 0, "", "schedule"),
    ):
        if needs is not None and needs != save_kind:
            continue
        values = [float(v) for v in (r.number(key) for r in measured) if v is not None]
        if values:
            ranges.append(f"{label} {_span(values, scale, digits, unit)}")
    if len(results) == 1:
        word = verdicts[0][1].word
    elif judged == 0:
        word = "not measurable"
    else:
        word = f"holds on {held} of {len(results)}"
    return RowVerdict(word, held, judged, len(results), "; ".join(ranges), verdicts)
