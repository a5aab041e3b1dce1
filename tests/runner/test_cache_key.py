"""The run's cache keys are typed values of the scenario's own fields (``runner.context.CacheKey``)."""

from __future__ import annotations

import dataclasses

from pytest_flashckpt.config.scenario import ActivationConfig, SaveConfig, Scenario
from pytest_flashckpt.runner.context import CacheKey


def test_a_key_leaves_out_what_the_kind_does_not_depend_on() -> None:
    base = Scenario("a", model="tiny", seq_len=64, activation=ActivationConfig("none", k=2))
    renamed = dataclasses.replace(base, name="b", rounds=9, description="other words")
    other_steps = dataclasses.replace(base, steps=2)
    other_save = dataclasses.replace(base, save=SaveConfig(strategy="sync", saves=3))
    assert CacheKey.of("memory pass", base) == CacheKey.of("memory pass", renamed)  # labels and rounds
    assert CacheKey.of("memory pass", base) == CacheKey.of("memory pass", other_steps)  # untimed: steps left out
    assert CacheKey.of("timing pass (5 rounds)", base) != CacheKey.of("timing pass (5 rounds)", other_steps)
    assert CacheKey.of("trainer", base) == CacheKey.of("trainer", other_save)
    assert CacheKey.of("checkpoint", base) != CacheKey.of("checkpoint", other_save)
    # no strategy runs: its options change nothing; with one they do (control)
    assert CacheKey.of("trainer", base) == CacheKey.of("trainer", dataclasses.replace(base, activation=ActivationConfig("none", k=1)))
    every = dataclasses.replace(base, activation=ActivationConfig("every_k", k=1))
    assert CacheKey.of("trainer", every) != CacheKey.of("trainer", dataclasses.replace(every, activation=ActivationConfig("every_k", k=2)))
    assert CacheKey.of("trainer", base) != CacheKey.of("memory pass", base)
    hash(CacheKey.of("checkpoint", base))
