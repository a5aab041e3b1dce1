"""Confirmation rounds: a timing pass whose first look reads slower than the baseline gets more rounds before it is
judged, so that a burst of noise in a few rounds is not a verdict, and a real slowdown is judged on more rounds.

The suite run (``runner.suite.SuiteRun``) puts its gate's question on the run context (``RunContext.more_rounds``:
``Gate.first_look`` against this profile's baseline, ``--flashckpt-confirm-rounds`` rounds when it reads slower);
the passes here only ask it, so the runner never reads a baseline. Why, and what it costs and catches:
docs/running.md ("Confirmation rounds") and baselines/README.md.
"""

from __future__ import annotations

from typing import Callable

from pytest_flashckpt.core.result import Result
from pytest_flashckpt.runner.context import RunContext
from pytest_flashckpt.runner.passes import TimingPass


def confirmation(ctx: RunContext, result: Result) -> Callable[[list[float]], int] | None:
    """The timing pass's ``more_rounds`` for ``result``'s scenario: the run context's (the suite run's gate), or
    None when nothing asks (no baseline, a baseline being refreshed, ``--flashckpt-confirm-rounds 0``)."""
    if ctx.more_rounds is None:
        return None
    ask = ctx.more_rounds
    return lambda samples: ask(result, samples)


def note_confirmation(result: Result, rounds: int, timing: TimingPass) -> None:
    """Say in the result's notes that the timing pass added confirmation rounds, and why (a pass shared with another
    scenario of the same step was looked at against that scenario's baseline: its own note names it)."""
    if timing.confirmation_rounds:
        result.notes.append(
            f"timing: the first {rounds} rounds read slower than the baseline of the scenario that measured them, so "
            f"{timing.confirmation_rounds} confirmation rounds were added; overhead is judged on all "
            f"{rounds + timing.confirmation_rounds}")
