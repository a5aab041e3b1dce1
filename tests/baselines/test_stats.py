"""The Mann-Whitney U test: exact p-values by enumeration (ties included), the normal approximation past the
exact limit, and the smallest p a given number of rounds can reach."""

import math

import numpy as np
import pytest

from pytest_flashckpt.baselines import stats
from pytest_flashckpt.baselines.stats import mann_whitney_greater, midranks, smallest_p


def test_complete_separation_gives_the_smallest_possible_p():
    assert mann_whitney_greater([2, 3], [0, 1]) == pytest.approx(1 / 6)
    assert mann_whitney_greater(range(10, 15), range(5)) == pytest.approx(1 / math.comb(10, 5))
    assert smallest_p(5, 10) == pytest.approx(1 / 3003)


def test_the_opposite_direction_is_not_significant():
    assert mann_whitney_greater([0, 1], [2, 3]) == 1.0


def test_identical_samples_give_p_one():
    assert mann_whitney_greater([1.0, 1.0, 1.0], [1.0, 1.0, 1.0]) == 1.0


def test_midranks_share_tied_ranks():
    assert midranks(np.array([3.0, 1.0, 3.0, 2.0])).tolist() == [3.5, 1.0, 3.5, 2.0]


def test_exact_p_with_ties_counts_splits_at_least_as_extreme():
    # pooled ranks of [1, 2] + [1, 0]: 0 -> 1, 1 -> 2.5, 1 -> 2.5, 2 -> 4; U(x) = 2.5 + 4 - 3 = 3.5
    # of the 6 splits, U >= 3.5 only for {2.5, 4} twice -> 2/6
    assert mann_whitney_greater([1, 2], [1, 0]) == pytest.approx(2 / 6)


def test_normal_approximation_agrees_with_the_exact_distribution(monkeypatch):
    rng = np.random.default_rng(0)
    x, y = rng.normal(1.0, 1.0, 8), rng.normal(0.0, 1.0, 8)
    exact = mann_whitney_greater(x, y)
    monkeypatch.setattr(stats, "EXACT_LIMIT", 0)
    approx = mann_whitney_greater(x, y)
    assert approx == pytest.approx(exact, abs=0.01)


def test_empty_or_non_finite_samples_are_errors():
    with pytest.raises(ValueError, match="at least one sample"):
        mann_whitney_greater([], [1.0])
    with pytest.raises(ValueError, match="finite"):
        mann_whitney_greater([float("nan")], [1.0])
