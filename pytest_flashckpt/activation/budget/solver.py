"""Choose one option per block: least recomputation whose predicted whole-step peak fits the budget.

The peak of a plan is ``max(before, max_i(below_i + reach[i][o_i]))`` with ``below_i`` the bytes the blocks
under ``i`` keep (``model.PlanCosts``). Walking the blocks bottom-up, the only thing the past hands the future
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

from pytest_flashckpt.activation.budget.model import BudgetTooSmall, Plan, PlanCosts

MAX_STATES = 4096


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


def _unwind(link) -> tuple[int, ...]:
    """Choices are kept as (option, parent) links so that growing a state costs O(1), not O(blocks)."""
    out = []
    while link is not None:
        out.append(link[0])
        link = link[1]
    return tuple(reversed(out))


def solve(costs: PlanCosts, budget: int, max_states: int = MAX_STATES) -> Plan:
    """The least-cost plan whose predicted peak is <= ``budget``; BudgetTooSmall if none fits."""
    start, cpu = time.perf_counter(), time.process_time()
    exact = costs.before <= budget
    states = [(0, 0.0, None)] if exact else []  # (below, cost, choice link)
    largest = len(states)
    options = range(len(costs.options))
    for i in range(costs.n_blocks):
        kept, reach = costs.kept[i], costs.reach[i]
        step_cost = [costs.cost(i, o) for o in options]
        fits = [o for o in options if reach[o] <= budget]
        grown = [
            (below + kept[o], cost + step_cost[o], (o, link))
            for below, cost, link in states
            for o in fits
            if below + reach[o] <= budget
        ]
        states, thinned = _thin(_pareto(grown), max_states)
        exact = exact and not thinned
        largest = max(largest, len(states))
    if not states:
        minimum = min_peak(costs, max_states)
        raise BudgetTooSmall(f"no plan fits {budget} bytes; the smallest achievable peak is {minimum.predicted_peak} bytes", minimum.predicted_peak)
    cheapest = min(s[1] for s in states)
    # among the cheapest plans (ties within float noise), the one with the lowest predicted peak
    tied = [_unwind(s[2]) for s in states if s[1] <= cheapest * (1 + 1e-12) + 1e-9]
    best = min(tied, key=costs.predict_peak)
    cost = sum(costs.cost(i, o) for i, o in enumerate(best))
    return Plan(
        best, costs.predict_peak(best), cost, costs.plan_flops(best), budget, exact, time.perf_counter() - start, largest,
        time.process_time() - cpu,
    )


def min_peak(costs: PlanCosts, max_states: int = MAX_STATES) -> Plan:
    """The plan with the smallest predicted peak (ties: least cost)."""
    start, cpu = time.perf_counter(), time.process_time()
    states = [(0, costs.before, None)]  # (below, peak so far, choice link)
    exact, largest = True, 1
    for i in range(costs.n_blocks):
        kept, reach = costs.kept[i], costs.reach[i]
        grown = [
            (below + kept[o], max(peak, below + reach[o]), (o, link))
            for below, peak, link in states
            for o in range(len(costs.options))
        ]
        states, thinned = _thin(_pareto(grown), max_states)
        exact = exact and not thinned
        largest = max(largest, len(states))
    lowest = min(s[1] for s in states)
    cheapest = solve(costs, lowest, max_states)  # the least recomputation at that peak
    return Plan(
        cheapest.choice, cheapest.predicted_peak, cheapest.cost, cheapest.flops, lowest,
        exact and cheapest.exact, time.perf_counter() - start, max(largest, cheapest.states), time.process_time() - cpu,
    )
