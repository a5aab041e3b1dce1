"""One ``simulate_step`` per distinct set of arguments in a test process: several modules assert different things
about the same simulated step (e.g. tiny, bf16, 1 x 128, flash, full in test_simulate_step and test_simulate_fsdp);
a step on ``meta`` is deterministic (seeded model, no data), so the second caller reads the first one's result.
Only for calls that run under no monkeypatch or other changed process state; errors are not cached."""

from __future__ import annotations

from functools import lru_cache

from pytest_flashckpt.config.model_card import ModelCard
from pytest_flashckpt.models.cards import load_card
from pytest_flashckpt.simulate import simulate_step
from pytest_flashckpt.simulate.result import SimulatedPeak


def simulated(card: ModelCard | str, *args, **kwargs) -> SimulatedPeak:
    """``simulate_step(card, *args, **kwargs)``, computed once per arguments (a card by name and its loaded card
    are the same card: ``simulate_step`` loads the name). The result is shared: read it, do not change its dicts."""
    return _simulated(load_card(card) if isinstance(card, str) else card, *args, **kwargs)


@lru_cache(maxsize=None)
def _simulated(*args, **kwargs) -> SimulatedPeak:
    return simulate_step(*args, **kwargs)
