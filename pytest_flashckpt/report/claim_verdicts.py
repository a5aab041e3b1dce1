"""Verdicts on the article's claims: does a measured result bear the claim out?

A claim has two parts, a memory saving ("~30%") and an overhead ("low"). Each part is judged on its own:

- saving: holds when ``|measured - claimed| <= tolerance`` (10 percentage points, ``claims.SAVING_TOLERANCE``);
- overhead: holds when the measured median step-time ratio lies in the claim's band (``claims.OVERHEAD_BANDS``);
  misses when the median and the whole min-max range over the timing rounds lie outside it; when the median is
  outside but the range reaches into the band, the timing is too noisy to judge (not measurable).

The verdict on the claim: **does not hold** when any measured part misses; **not measurable** when nothing
misses but a part could not be measured (scenario skipped, metric absent: the reason says which); **holds**
when both parts were measured and both hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pytest_flashckpt.claims import Claim, OverheadBand
from pytest_flashckpt.report.format import pct, ratio
from pytest_flashckpt.result import Result

VerdictWord = Literal["holds", "does not hold", "not measurable"]


@dataclass(frozen=True)
class Verdict:
    word: VerdictWord
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
    value = result.metrics.get("memory_saving")
    if not isinstance(value, (int, float)):
        why = "the scenario did not measure memory" if "memory" not in result.config.get("measure", ["memory"]) else (
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
    value = result.metrics.get("overhead")
    if not isinstance(value, (int, float)):
        why = "the scenario did not measure timing" if "timing" not in result.config.get("measure", ["timing"]) else (
            "no overhead recorded (no reference timing)"
        )
        return PartVerdict(None, f"overhead not measurable: {why}")
    band = claim.overhead
    if band.contains(value):
        return PartVerdict(True, f"overhead {ratio(value)} is {claim.overhead_text} ({band.describe()})")
    side = "above" if band.high is not None and value > band.high else "below"
    low, high = result.metrics.get("overhead_min"), result.metrics.get("overhead_max")
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and _overlaps(band, low, high):
        return PartVerdict(None, (
            f"overhead {ratio(value)} is {side} {claim.overhead_text} ({band.describe()}), but its rounds "
            f"({low:.2f}-{high:.2f}) reach into it: too noisy to judge"
        ))
    return PartVerdict(False, f"overhead {ratio(value)} is {side} {claim.overhead_text} ({band.describe()})")


def _overlaps(band: OverheadBand, low: float, high: float) -> bool:
    """Does the min-max range of the rounds reach into the band?"""
    return high > band.low and (band.high is None or low <= band.high)


def judge(claim: Claim, result: Result | None, missing: str | None = None) -> Verdict:
    """The verdict on ``claim`` from one result (None: no scenario tested it; ``missing`` says why)."""
    if result is None:
        return Verdict("not measurable", missing or f"no scenario with article: {claim.id} ran in this suite")
    if result.status == "skipped":
        return Verdict("not measurable", f"skipped on this hardware: {result.reason or 'no reason given'}")
    if result.status != "measured":
        return Verdict("not measurable", f"{result.status}: {result.reason or 'no reason given'}")
    parts = [judge_saving(claim, result), judge_overhead(claim, result)]
    reason = "; ".join(p.text for p in parts)
    if any(p.ok is False for p in parts):
        return Verdict("does not hold", reason)
    if any(p.ok is None for p in parts):
        return Verdict("not measurable", reason)
    return Verdict("holds", reason)
