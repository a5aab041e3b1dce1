"""Change points of one series with Apache Otava's e-divisive method (``otava.analysis.compute_change_points``:
Fleming et al., "Hunter", ICPE 2023; the method MongoDB's and Datastax's CI use). It needs only numpy and scipy,
but the ``apache-otava`` distribution pins numpy 2.2 and pulls cloud clients, so it is optional and installed with
``pip install --no-deps apache-otava==0.8.0 scipy``; without it, ``require`` is an error saying that.

Why e-divisive and not a threshold on consecutive runs: a single noisy run moves one point, a change moves every
point after it; e-divisive tests where splitting the series in two makes the halves' distributions differ most,
and a permutation/t-test decides whether the split is real. A shift is reported with its size (``change``: mean
after over mean before, minus one), so ``min_magnitude`` can drop changes too small to matter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

INSTALL = "pip install --no-deps apache-otava==0.8.0 scipy"
MIN_POINTS = 6  # fewer than 3 runs on each side of a split cannot make any test significant


class OtavaMissing(ImportError):
    """Apache Otava is not installed; the message gives the install line."""


@dataclass(frozen=True)
class ChangePoint:
    index: int  # the first run after the change
    before: float  # mean of the segment before it
    after: float  # mean of the segment after it
    p_value: float

    @property
    def change(self) -> float:
        return self.after / self.before - 1.0 if self.before else float("inf")


def require():
    """``otava.analysis.compute_change_points``, or OtavaMissing with the install line."""
    try:
        from otava.analysis import compute_change_points
    except ImportError as exc:
        raise OtavaMissing(f"flashckpt history needs Apache Otava's change-point code ({exc}); install it with: {INSTALL}") from None
    return compute_change_points


def change_points(values: Sequence[float], max_pvalue: float = 0.001, min_magnitude: float = 0.02,
                  window: int = 50) -> list[ChangePoint]:
    """Change points of ``values`` (oldest first); [] for a series too short to split."""
    if len(values) < MIN_POINTS:
        return []
    compute = require()
    found, _ = compute([float(v) for v in values], window_len=window, max_pvalue=max_pvalue, min_magnitude=min_magnitude)
    return [ChangePoint(int(c.index), float(c.stats.mean_1), float(c.stats.mean_2), float(c.stats.pvalue)) for c in found]


def change_points_within(values: Sequence[float], segments: Sequence[range], max_pvalue: float = 0.001,
                         min_magnitude: float = 0.02) -> list[ChangePoint]:
    """Change points of ``values`` found in each segment alone (indices into ``values``): a profile change
    (another machine, torch, kernel) is a step by itself, so a split across it would be reported as a change of
    the code; no change point ever spans a segment boundary."""
    found = []
    for segment in segments:
        for cp in change_points(values[segment.start:segment.stop], max_pvalue, min_magnitude):
            found.append(ChangePoint(cp.index + segment.start, cp.before, cp.after, cp.p_value))
    return found
