"""The significance test behind the timing gate: a one-sided Mann-Whitney U test, numpy only.

Why Mann-Whitney and not a t-test or a bootstrap: per-round timing ratios on a shared machine are not normal; a
noisy neighbour produces the odd round far off the rest. A rank test is not moved by how far off that round is,
only by its rank. A bootstrap interval needs tens of samples to mean anything, and suites time 2-10 rounds.
With so few samples the *exact* null distribution is cheap: all C(n1+n2, n1) ways of splitting the pooled
ranks (mid-ranks for ties, so ties are handled exactly, not approximately) are enumerated. Past
``EXACT_LIMIT`` splits the normal approximation with tie and continuity corrections is used.

Honesty about power: the smallest p-value an exact test can ever give is ``1 / C(n1+n2, n1)`` (complete
separation). For 2 vs 2 rounds that is 1/6 = 0.17, for 3 vs 3 1/20, for 5 vs 5 1/252 = 0.004, for 5 vs 10
1/3003. ``smallest_p`` reports it so the gate can say when a comparison cannot be significant at all.

Minimum detectable effect (shift detected in 95% of runs at alpha = 0.01; iid normal round-to-round noise of
standard deviation sigma; simulated with this function): current 5 vs baseline 10 rounds: ~2.5 sigma; 10 vs 10:
~2.2 sigma; 5 vs 5, 3 vs 10 and 2 vs 20: ~3.5 sigma; 2 vs 10: never (smallest p 1/66). So on a machine whose
per-round overhead ratio varies by sigma = 3%, a 10% slowdown is caught with 5 vs 10 rounds; at sigma = 10% it
is not, and the gate says ``~`` rather than guessing.
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np

EXACT_LIMIT = 50_000  # enumerate the exact distribution up to this many splits (C(16, 8) = 12870, C(20, 10) = 184756)


def midranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks; tied values share the mean of their ranks."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=float)
    sorted_values = values[order]
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_values[j + 1] == sorted_values[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def smallest_p(n1: int, n2: int) -> float:
    """The smallest one-sided p-value the exact test can reach with these sample sizes (no ties)."""
    return 1.0 / math.comb(n1 + n2, n1)


def mann_whitney_greater(x: Sequence[float], y: Sequence[float]) -> float:
    """One-sided p-value of H1 "values in ``x`` tend to be larger than values in ``y``".

    Exact (full enumeration of rank splits, ties included) when C(n1+n2, n1) <= EXACT_LIMIT; otherwise the
    normal approximation of U with the tie-corrected variance and a continuity correction."""
    a = np.asarray(x, dtype=float)
    b = np.asarray(y, dtype=float)
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        raise ValueError("the Mann-Whitney test needs at least one sample on each side")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("the Mann-Whitney test needs finite samples")
    ranks = midranks(np.concatenate([a, b]))
    offset = n1 * (n1 + 1) / 2.0
    u_observed = ranks[:n1].sum() - offset
    if math.comb(n1 + n2, n1) <= EXACT_LIMIT:
        splits = np.array(list(itertools.combinations(range(n1 + n2), n1)), dtype=np.int64)
        u_all = ranks[splits].sum(axis=1) - offset
        return float(np.mean(u_all >= u_observed - 1e-9))
    n = n1 + n2
    _, tie_counts = np.unique(ranks, return_counts=True)
    tie_term = float(np.sum(tie_counts.astype(float) ** 3 - tie_counts)) / (n * (n - 1))
    variance = n1 * n2 / 12.0 * ((n + 1) - tie_term)
    if variance <= 0:
        return 1.0  # every value tied: no evidence either way
    z = (u_observed - n1 * n2 / 2.0 - 0.5) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2.0))
