"""Typed regression verdicts: one ``RegressionVerdict`` per scenario and metric, and the run's ``Comparison`` with
the stored baseline (stored in ``results.json`` as ``comparison``). Built by ``baselines`` (the gate), rendered by
``report`` (the markdown report and the CI step summary).

The gate's notes (a metric not compared, unguarded, within noise, unstable, a regression on a busy machine) are
``VerdictNote`` rows with a ``kind``; ``Comparison.text`` is the summary and the notes as one line for the report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Literal

VerdictWord = Literal["ok", "improved", "regressed", "~", "unstable", "unguarded", "missing", "not comparable"]
ComparisonStatus = Literal["compared", "no-baseline", "other-profile", "disabled"]
NoteKind = Literal["probe", "unguarded", "~", "unstable", "busy-machine", "coverage", "run", "not-comparable"]
"""What a gate note is about: a metric not compared (probe changed), a verdict that needs a reason (unguarded, ~,
unstable, a regression flagged ``busy-machine``), the run's coverage (a subset, scenarios not in the baseline), or a
condition of the run (``--flashckpt-save-baseline``), or a scenario whose configuration changed under its name since
the baseline was stored (``not-comparable``: its numbers are not judged). Files written before notes were typed
have none: their notes stayed in ``Comparison.message``."""
VERDICT_ORDER: tuple[str, ...] = ("regressed", "missing", "not comparable", "improved", "~", "unstable", "unguarded", "ok")


@dataclass(frozen=True, eq=True)
class RegressionVerdict:
    """One metric of one scenario, baseline vs current (medians for sampled metrics)."""

    scenario: str
    metric: str  # "*" for a whole scenario (a missing one)
    baseline: float | None  # None only for a missing scenario
    current: float | None  # None when missing
    change: float | None  # current / baseline - 1; None when the baseline is 0
    p_value: float | None  # one-sided Mann-Whitney U, for metrics judged on per-round samples
    verdict: VerdictWord
    smallest_p: float | None = None  # the smallest p these sample sizes can reach (sampled metrics)
    reason: str | None = None  # why, for every verdict but ok (missing, unguarded, unstable, ~, a noisy regression)
    busy_machine: bool = False  # a significant change while this run's rounds scattered far more than the baseline's

    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RegressionVerdict":
        return cls(**{f.name: data.get(f.name, None if f.default is MISSING else f.default) for f in fields(cls)})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class VerdictNote:
    """One note of the gate, a sentence a reader must see beside the verdict counts."""

    kind: NoteKind
    text: str

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "VerdictNote":
        return cls(data["kind"], data["text"])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(eq=True)
class Comparison:
    """A run against this profile's stored baseline: ``message`` says what was compared (the counts, or why
    nothing was), ``notes`` what a reader must know beside it."""

    status: ComparisonStatus
    baseline_path: str | None
    baseline_profile_id: str | None
    message: str | None
    verdicts: list[RegressionVerdict] = field(default_factory=list)
    notes: list[VerdictNote] = field(default_factory=list)

    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Comparison":
        """A Comparison from its JSON form (``to_dict``)."""
        return cls(
            status=data.get("status", "compared"), baseline_path=data.get("baseline_path"),
            baseline_profile_id=data.get("baseline_profile_id"), message=data.get("message"),
            verdicts=[RegressionVerdict.from_dict(v) for v in data.get("verdicts") or []],
            # a file written before notes were typed has them inside ``message``: it stays there, shown as it was
            notes=[VerdictNote.from_dict(n) for n in data.get("notes") or []],
        )

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("verdicts", "notes")},
                "verdicts": [v.to_dict() for v in self.verdicts], "notes": [n.to_dict() for n in self.notes]}

    @property
    def text(self) -> str:
        """The message and every note, in that order, as one paragraph (the report's line under its heading)."""
        return "; ".join(part for part in [self.message or "", *(n.text for n in self.notes)] if part)

    def counts(self) -> dict[str, int]:
        return {word: sum(v.verdict == word for v in self.verdicts) for word in VERDICT_ORDER}

    @property
    def regressed(self) -> list[RegressionVerdict]:
        return [v for v in self.verdicts if v.verdict == "regressed"]
