"""Choose one option per block: least recomputation whose predicted whole-step peak fits the budget.

The peak of a plan is ``max(before, max_i(below_i + reach[i][o_i]))`` with ``below_i`` the bytes the blocks
under ``i`` keep (``costs.PlanCosts``). Walking the blocks bottom-up, the only thing the past hands the future
is ``below_i``, and less is never worse, so a dynamic program over blocks whose states are the Pareto frontier
of (``below``, cost so far) is exact: a state dominated in both can be dropped without losing the optimum.
No discretisation is needed; the frontier's size is bounded by the number of distinct ``below`` values.

Fallback (stated, never silent): if a frontier grows past ``max_states`` (deep models with many options), it
is thinned to ``max_states`` states spread evenly over ``below``, keeping the cheapest state in each slice. Every
state kept is a real plan checked against the budget with its exact bytes, so the fallback can only lose
optimality (more recomputation), never fit: the returned ``Plan.exact`` is False when it was used.

``min_peak`` is the same walk minimising the peak instead (states: Pareto frontier of (``below``, peak so far)).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pytest_flashckpt.activation.budget.costs import PlanCosts

MAX_STATES = 4096


class BudgetTooSmall(ValueError):
    """No plan fits: ``minimum`` is the smallest achievable peak (bytes)."""

    def __init__(self, message: str, minimum: int) -> None:
        super().__init__(message)
        self.minimum = minimum


@dataclass(frozen=True)
class Plan:
    """Option index per block, the predicted peak (bytes) and recompute cost, and how it was found."""

    choice: tuple[int, ...]
    predicted_peak: int
    cost: float
    flops: int
    budget: int
    exact: bool
    seconds: float
    states: int  # largest frontier seen

    def names(self, costs: PlanCosts) -> tuple[str, ...]:
        return tuple(costs.options[o].name for o in self.choice)


def _thin(states: list, max_states: int) -> tuple[list, bool]:
    if len(states) <= max_states:
        return states, False
    lo, hi = states[0][0], states[-1][0]
    width = (hi - lo) / max_states or 1
    kept: dict[int, tuple] = {}
    for state in states:
        key = int((state[0] - lo) / width)
        if key not in kept or state[1] < kept[key][1]:
            kept[key] = state
    return sorted(kept.values()), True


def _pareto(states: list) -> list:
    """Sort by (below, second) and keep states whose second value strictly improves on every smaller below."""
    states.sort(key=lambda s: (s[0], s[1]))
    frontier, best = [], float("inf")
    for state in states:
        if state[1] < best:
            frontier.append(state)
            best = state[1]
    return frontier


def solve(costs: PlanCosts, budget: int, max_states: int = MAX_STATES) -> Plan:
    """The least-cost plan whose predicted peak is <= ``budget``; BudgetTooSmall if none fits."""
    start = time.perf_counter()
    exact = costs.before <= budget
    states = [(0, 0.0, ())] if exact else []  # (below, cost, choice)
    largest = len(states)
    n_options = len(costs.options)
    for i in range(costs.n_blocks):
        grown = []
        for below, cost, choice in states:
            for o in range(n_options):
                if below + costs.reach[i][o] <= budget:
                    grown.append((below + costs.kept[i][o], cost + costs.cost(i, o), choice + (o,)))
        states, thinned = _thin(_pareto(grown), max_states)
        exact = exact and not thinned
        largest = max(largest, len(states))
    if not states:
        minimum = min_peak(costs, max_states)
        raise BudgetTooSmall(f"no plan fits {budget} bytes; the smallest achievable peak is {minimum.predicted_peak} bytes", minimum.predicted_peak)
    cheapest = min(s[1] for s in states)
    # among the cheapest plans (ties within float noise), the one with the lowest predicted peak
    best = min((s for s in states if s[1] <= cheapest * (1 + 1e-12) + 1e-9), key=lambda s: costs.predict_peak(s[2]))
    return Plan(best[2], costs.predict_peak(best[2]), best[1], costs.plan_flops(best[2]), budget, exact, time.perf_counter() - start, largest)


def min_peak(costs: PlanCosts, max_states: int = MAX_STATES) -> Plan:
    """The plan with the smallest predicted peak (ties: least cost)."""
    start = time.perf_counter()
    states = [(0, costs.before, ())]  # (below, peak so far, choice)
    exact, largest = True, 1
    for i in range(costs.n_blocks):
        grown = [
            (below + costs.kept[i][o], max(peak, below + costs.reach[i][o]), choice + (o,))
            for below, peak, choice in states
            for o in range(len(costs.options))
        ]
        states, thinned = _thin(_pareto(grown), max_states)
        exact = exact and not thinned
        largest = max(largest, len(states))
    lowest = min(s[1] for s in states)
    cheapest = solve(costs, lowest, max_states)  # the least recomputation at that peak
    return Plan(
        cheapest.choice, cheapest.predicted_peak, cheapest.cost, cheapest.flops, lowest,
        exact and cheapest.exact, time.perf_counter() - start, max(largest, cheapest.states),
    )
