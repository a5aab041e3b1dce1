"""Which scenarios of a run share one timing pass: the reference's steps timed once per round for all of them.

A scenario's timing pass interleaves its step with its reference's, round by round, so each round gives one ratio
measured side by side. When several scenarios of a run share a reference (the activation suite's strategies of one
workload), one pass per scenario times the reference again beside each: at 4 x 256 tokens on ``tiny``, 70 timed
steps for the reference and three strategies, 30 of them the reference's again. One pass over the reference and
every strategy of its workload (R A B C in one round, C B A R in the next) gives every scenario the same number
of rounds, each ratio against the reference of the same round, for 40 timed steps.

Grouped only where the group's trainers can be built side by side and the run knows its scenarios before the first
one runs (``RunContext.planned``: the pytest plugin's selected items, ``flashckpt run``'s suite): in-process, eager
scenarios on the CPU. On a GPU each scenario keeps its own pass (the group's trainers at once could exceed the
device's memory a single scenario fits in). See docs/architecture.md ("Timing").
"""

from __future__ import annotations

from typing import Sequence

from pytest_flashckpt.config.scenario import Scenario
from pytest_flashckpt.runner.context import CacheKey, RunContext


def timing_kind(scenario: Scenario) -> str:
    """The cache kind of a scenario's timing pass (``RunContext.cached``): scenarios that train the same step with
    the same rounds share one entry (the article's medium and large rows differ only in their save)."""
    return f"timing pass ({scenario.rounds} rounds)"


def timing_key(scenario: Scenario) -> CacheKey:
    return CacheKey.of(timing_kind(scenario), scenario)


def _groupable(scenario: Scenario) -> bool:
    """Timed in this process, eager: what the in-process runner's ``timing_pass`` would time."""
    return ("timing" in scenario.measure and not scenario.compile.enabled and scenario.world_size == 1
            and not scenario.simulate.enabled)


def timing_groups(planned: Sequence[Scenario]) -> dict[CacheKey, list[Scenario]]:
    """Each planned scenario's timing key -> the planned scenarios timed in one pass with it: those with the same
    reference step, rounds and steps per round, one per distinct timed step (in planned order; the reference itself
    when it is planned). Only groups of two or more distinct steps: a scenario missing here is timed alone."""
    by_reference: dict[CacheKey, dict[CacheKey, Scenario]] = {}
    for scenario in planned:
        if _groupable(scenario):
            members = by_reference.setdefault(CacheKey.of(timing_kind(scenario), scenario.reference()), {})
            members.setdefault(timing_key(scenario), scenario)
    groups: dict[CacheKey, list[Scenario]] = {}
    for members in by_reference.values():
        if len(members) >= 2:
            for key in members:
                groups[key] = list(members.values())
    return groups


def group_of(ctx: RunContext, scenario: Scenario) -> list[Scenario] | None:
    """The planned scenarios timed in one pass with ``scenario``, or None: timed alone (nothing planned, a CUDA
    device, no other scenario of its reference planned). The run's groups are worked out once (``ctx.cache``)."""
    if ctx.planned is None or ctx.device.type != "cpu":
        return None
    groups = ctx.cache.get(GROUPS_CACHE)
    if groups is None:
        groups = ctx.cache[GROUPS_CACHE] = timing_groups(ctx.planned)
    return groups.get(timing_key(scenario))


GROUPS_CACHE = "timing groups"
