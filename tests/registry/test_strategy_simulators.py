"""The three simulators that take only some strategies read their lists off the registry's rows
(``runs_on_fake_ranks``, ``fit_order``, ``simulated_compiled``): the derived lists are exactly the ones the code
carried as literals before, so a wrong attribute on a row fails here; flipping one attribute changes its list (the
control); and a row whose attributes contradict each other is refused when it is registered."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_flashckpt.core import registry
from pytest_flashckpt.core.registry import ActivationStrategySpec, register_activation_strategy
from pytest_flashckpt.fit import candidates
from pytest_flashckpt.simulate import compiled, layouts, stage_layouts

# the literals simulate/layouts.py, fit/candidates.py and simulate/compiled.py carried before they were derived
LAYOUT_LITERAL = ("none", "full", "every_k", "selective_op")
FIT_LITERAL = ("none", "selective_op", "every_k", "full")
COMPILED_LITERAL = ("none", "full", "every_k", "selective_op", "compile_budget", "budget")


def test_the_derived_lists_equal_the_literals_they_replace() -> None:
    assert layouts.LAYOUT_STRATEGIES == LAYOUT_LITERAL
    assert stage_layouts.LAYOUT_STRATEGIES is layouts.LAYOUT_STRATEGIES
    assert candidates.STRATEGIES == FIT_LITERAL
    assert compiled.STRATEGIES == COMPILED_LITERAL


@pytest.mark.parametrize(("name", "change", "derive", "expected"), [
    ("every_k", {"runs_on_fake_ranks": False, "fit_order": None}, registry.fake_rank_strategies, ("none", "full", "selective_op")),
    ("full", {"fit_order": 0}, registry.fit_strategies, ("none", "full", "selective_op", "every_k")),
    ("budget", {"simulated_compiled": "traced"}, registry.compiled_strategies,
     ("none", "full", "every_k", "selective_op", "budget", "compile_budget")),
])
def test_one_attribute_changed_changes_its_list(monkeypatch, name, change, derive, expected) -> None:
    # control for the test above: the lists follow the rows, so a row with a wrong attribute would fail it
    monkeypatch.setitem(registry.ACTIVATION_STRATEGIES, name, dataclasses.replace(registry.ACTIVATION_STRATEGIES[name], **change))
    assert derive() == expected


@pytest.mark.parametrize(("attributes", "message"), [
    ({"runs_on_fake_ranks": True, "not_simulated": "why not"}, "runs_on_fake_ranks needs a plan the meta step simulates"),
    ({"runs_on_fake_ranks": True, "takes_budget": True}, "runs_on_fake_ranks needs a plan the meta step simulates"),
    ({"fit_order": 1}, "fit_order 1 needs runs_on_fake_ranks"),
    ({"simulated_compiled": "eager"}, "simulated_compiled 'eager' is unknown; use one of traced, partitioner, policies"),
])
def test_contradicting_attributes_are_refused_when_registered(attributes, message) -> None:
    spec = ActivationStrategySpec("contradicting", "a row that cannot hold", "nowhere:plan", **attributes)
    with pytest.raises(ValueError, match=f"activation strategy 'contradicting': {message}"):
        register_activation_strategy(spec)
    assert "contradicting" not in registry.ACTIVATION_STRATEGIES


def test_a_consistent_row_is_registered() -> None:  # control for the refusals: the checks let a sound row through
    spec = ActivationStrategySpec("consistent", "a row that holds", "nowhere:plan", runs_on_fake_ranks=True, fit_order=1,
                                  simulated_compiled="traced")
    try:
        assert register_activation_strategy(spec) is spec
    finally:
        registry.ACTIVATION_STRATEGIES.pop("consistent", None)
