"""The ``budget`` strategy: measured costs predict the step's peak to the byte, plans fit their budget, every
plan is bitwise equivalent to no checkpointing (dropout on), shapes are planned separately, and bad budgets are
clear errors. Models are tiny (width 32) so a hypothesis example costs milliseconds, not a training step of tiny."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pytest_flashckpt.activation import apply_ac, apply_budget
from pytest_flashckpt.activation.budget import BudgetSpec, BudgetTooSmall, MeasuredCosts, PlanCosts, min_peak, solve
from pytest_flashckpt.activation.budget.costs import measure_pointwise_weight
from pytest_flashckpt.activation.options import BY_ROLE, FULL, NONE
from pytest_flashckpt.activation.wrapper import switchable_forwards
from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.config.typed import build
from pytest_flashckpt.models import GPTConfig, build_model
from pytest_flashckpt.probes.cpu import LiveTensorProbe
from pytest_flashckpt.training import Trainer, make_batch

SHAPES = [(1, 16), (2, 32), (1, 48)]
# Each option costs one measured step per shape; five of the eight keep the tests fast and still mix keep,
# three kinds of saving by role and full recompute.
OPTIONS = (NONE, BY_ROLE[1], BY_ROLE[3], BY_ROLE[5], FULL)


def micro(dropout: float = 0.1, n_layer: int = 3) -> GPTConfig:
    return GPTConfig(vocab_size=64, block_size=64, n_layer=n_layer, n_head=2, n_embd=32, dropout=dropout)


class CachedSource:
    """One measured source per (config, backend), costs cached per shape, shared across hypothesis examples."""

    _sources: dict = {}

    def __init__(self, config: GPTConfig, backend: str = "sdpa") -> None:
        key = (config, backend)
        if key not in self._sources:
            # a fixed pointwise weight keeps the plans reproducible across runs; measuring it is tested below
            self._sources[key] = (MeasuredCosts(build_model(config, backend), OPTIONS, pointwise_weight=50.0), {})
        self.source, self.cache = self._sources[key]
        self.options = self.source.options

    def costs(self, batch_size: int, seq_len: int) -> PlanCosts:
        if (batch_size, seq_len) not in self.cache:
            self.cache[batch_size, seq_len] = self.source.costs(batch_size, seq_len)
        return self.cache[batch_size, seq_len]


def measured_peak(trainer: Trainer) -> int:
    with LiveTensorProbe().track(trainer.state_tensors()) as reading:
        trainer.train_step()
    return reading.peak_bytes


@pytest.mark.slow
@pytest.mark.parametrize("backend, dropout", [("sdpa", 0.1), ("sdpa", 0.0), ("eager", 0.1)])
def test_predicted_peak_equals_the_probe_on_mixed_plans(backend, dropout):
    config = micro(dropout)
    costs = CachedSource(config, backend).costs(2, 32)
    for option in costs.options:  # the uniform plans are what was measured
        uniform = [costs.option_index(option)] * costs.n_blocks
        assert costs.predict_peak(uniform) == costs.measured_peaks[option.name]
    model = build_model(config, backend)
    forwards = switchable_forwards(model)
    trainer = Trainer.create(model, 2, 32)
    trainer.train_step()
    rng = random.Random(0)
    for _ in range(6):  # mixed plans were never measured: additivity is what is tested
        plan = [rng.randrange(len(costs.options)) for _ in range(costs.n_blocks)]
        for forward, o in zip(forwards, plan):
            forward.option = costs.options[o]
        assert measured_peak(trainer) == costs.predict_peak(plan), [costs.options[o].name for o in plan]


def _step(model, batch_size: int, seq_len: int):
    x, y = make_batch(model.config.vocab_size, batch_size, seq_len, seed=3, position=0)
    torch.manual_seed(7)
    loss = model(x, y)
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.slow
@given(span=st.floats(0.0, 1.0), shape=st.sampled_from(SHAPES), backend=st.sampled_from(["sdpa", "eager"]))
def test_every_plan_fits_its_budget_and_is_bitwise_equal_to_none_with_dropout(span, shape, backend):
    config = micro(0.1)
    source = CachedSource(config, backend)
    reference = build_model(config, backend)
    ref_loss, ref_grads = _step(reference, *shape)
    model = build_model(config, backend)
    applied = apply_budget(model, f"min + {span * 100:.3f}%", shape, source=source)
    loss, grads = _step(model, *shape)
    assert torch.equal(loss, ref_loss)
    for name, grad in ref_grads.items():
        assert torch.equal(grads[name], grad), name
    shape_plan = applied.plans[shape]
    assert shape_plan.min_peak <= shape_plan.budget_bytes <= shape_plan.none_peak
    assert shape_plan.plan.predicted_peak <= shape_plan.budget_bytes
    trainer = Trainer.create(model, *shape)
    trainer.train_step()
    assert measured_peak(trainer) == shape_plan.plan.predicted_peak


def test_solver_is_exact_against_brute_force_and_flags_its_fallback():
    costs = CachedSource(micro(0.1)).costs(2, 32)
    n_options = len(costs.options)
    plans = list(itertools.product(range(n_options), repeat=costs.n_blocks))
    peaks = [costs.predict_peak(p) for p in plans]
    lowest = min(peaks)
    assert min_peak(costs).predicted_peak == lowest
    for budget in sorted(set(peaks))[:: max(1, len(set(peaks)) // 12)]:
        best = min(sum(costs.cost(i, o) for i, o in enumerate(p)) for p, peak in zip(plans, peaks) if peak <= budget)
        plan = solve(costs, budget)
        assert plan.exact and plan.predicted_peak <= budget
        assert plan.cost == pytest.approx(best, rel=1e-12)
    thinned = solve(costs, max(peaks), max_states=1)
    assert not thinned.exact and thinned.predicted_peak <= max(peaks)
    with pytest.raises(BudgetTooSmall):
        solve(costs, lowest - 1)


def test_more_budget_never_means_more_recomputation_or_a_lower_fit():
    costs = CachedSource(micro(0.1)).costs(2, 32)
    lowest, none_peak = min_peak(costs).predicted_peak, costs.none_peak()
    budgets = [lowest + (none_peak - lowest) * k // 9 for k in range(10)]
    plans = [solve(costs, b) for b in budgets]
    assert all(a.cost >= b.cost for a, b in zip(plans, plans[1:]))
    assert plans[-1].flops == 0 and plans[-1].predicted_peak == none_peak


def test_a_budget_below_the_minimum_names_the_key_and_the_minimum():
    config = micro(0.1)
    model = build_model(config, "sdpa")
    source = CachedSource(config)
    lowest = min_peak(source.costs(2, 32)).predicted_peak
    with pytest.raises(BudgetTooSmall) as info:
        apply_budget(model, lowest - 1, (2, 32), source=source)
    message = str(info.value)
    assert "activation.budget" in message and f"{lowest:,} bytes" in message and info.value.minimum == lowest


@pytest.mark.slow
def test_a_stream_of_mixed_lengths_stays_under_the_budget_and_recomputes_less_than_one_worst_case_plan():
    config = micro(0.1)
    source = CachedSource(config)
    longest = (2, 48)
    worst = source.costs(*longest)
    budget = min_peak(worst).predicted_peak + (worst.none_peak() - min_peak(worst).predicted_peak) // 4
    model = build_model(config, "sdpa")
    applied = apply_budget(model, budget, source=source)
    stream = [16, 48, 32, 16, 48, 32]
    trainer = Trainer.create(model, 2, 16)
    trainer.train_step()
    adaptive_flops = fixed_flops = 0
    fixed = applied.planner.plan(*longest).plan.choice
    for seq in stream:
        trainer.seq_len = seq
        assert measured_peak(trainer) <= budget, seq
        costs = source.costs(2, seq)
        adaptive_flops += applied.plans[2, seq].plan.flops
        fixed_flops += costs.plan_flops(fixed)
        assert costs.predict_peak(fixed) <= budget  # the worst-case plan fits too: the comparison is fair
    assert set(applied.plans) == {(2, s) for s in {16, 48, 32}}
    assert adaptive_flops < fixed_flops
    assert "b2xs48" in applied.describe() and applied.to_dict()["plans"]


def test_apply_ac_budget_plans_the_given_shape_and_refuses_a_second_strategy():
    model = build_model(micro(0.0, n_layer=1), "sdpa")  # the default source measures all options: one block
    applied = apply_ac(model, ActivationConfig(strategy="budget", budget=1.0), shape=(1, 8))
    assert applied.strategy == "budget" and (1, 8) in applied.plans
    assert applied.plans[1, 8].budget_bytes == applied.plans[1, 8].none_peak
    with pytest.raises(RuntimeError, match="already applied"):
        apply_ac(model, ActivationConfig(strategy="full"))


@pytest.mark.parametrize(
    "budget, kind, value",
    [("6 GiB", "bytes", 6 * 2**30), (123456789, "bytes", 123456789), (0.6, "fraction", 0.6), (1, "fraction", 1.0),
     ("min", "span", 0.0), ("min + 30%", "span", 0.3)],
)
def test_budget_values(budget, kind, value):
    spec = BudgetSpec.parse(budget)
    assert (spec.kind, spec.value) == (kind, pytest.approx(value))


@pytest.mark.parametrize(
    "data, message",
    [({"strategy": "budget"}, "activation.budget is required"),
     ({"strategy": "full", "budget": "1 GiB"}, "activation.budget is set but activation.strategy is 'full'"),
     ({"strategy": "budget", "budget": "6 parsecs"}, "activation.budget"),
     ({"strategy": "budget", "budget": 1.5}, "neither a fraction in (0, 1] nor a whole number of bytes"),
     ({"strategy": "budget", "budget": "min + 150%"}, "past the no-checkpointing peak"),
     ({"strategy": "budget", "budget": 0}, "activation.budget")],
)
def test_bad_budgets_are_config_errors_naming_the_key(data, message):
    with pytest.raises(ConfigError) as info:
        build(ActivationConfig, data, where="suites/budget.yaml", path="activation")
    assert message in str(info.value) and "suites/budget.yaml" in str(info.value)


def test_pointwise_weight_is_measured_and_positive():
    assert measure_pointwise_weight() > 0
