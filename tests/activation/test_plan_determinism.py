"""The budget planner plans the same twice: its objective needs no timing (a fixed pointwise weight), so the same
budget gives the same plan on every run and from measured and simulated costs alike; ``--budget`` on the command
line reads a fraction, ``min`` and ``min + N%`` as a suite does."""

from __future__ import annotations

import time

import pytest
import torch

from pytest_flashckpt.activation.budget import MeasuredCosts
from pytest_flashckpt.activation.budget.costs import MACHINE_BALANCE, pointwise_weight_for
from pytest_flashckpt.activation.budget.planner import BudgetPlanner
from pytest_flashckpt.cli import main
from pytest_flashckpt.config.budget import BudgetSpec
from pytest_flashckpt.models import GPTConfig, build_model
from pytest_flashckpt.simulate import simulate_step
from pytest_flashckpt.simulate.costs import SimulatedCosts

CONFIG = GPTConfig(vocab_size=97, block_size=96, n_layer=4, n_head=3, n_embd=48)  # odd sizes
SHAPE = (2, 80)
BUDGETS = ("min", "min + 10%", "min + 35%", "min + 60%", "min + 85%", "min + 100%", 0.7, "0.9")


@pytest.fixture
def no_clock(monkeypatch):
    """Planning must not time anything: a clock that jumps would change a timed weight, never a fixed one."""
    ticks = iter(range(0, 10**9, 7919))
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks) * 1e-3)


def _plans(source) -> list[tuple[int, ...]]:
    return [BudgetPlanner(BudgetSpec.parse(b), source).plan(*SHAPE).plan.choice for b in BUDGETS]


def test_the_pointwise_weight_is_a_fixed_model_not_a_timing(no_clock):
    assert pointwise_weight_for("cpu", torch.float32) == 2 * 4 * MACHINE_BALANCE["cpu"] == 128.0
    assert pointwise_weight_for("cuda", torch.bfloat16) == 2 * 2 * MACHINE_BALANCE["cuda"]
    assert MeasuredCosts(build_model(CONFIG, "sdpa")).pointwise_weight == 128.0
    assert SimulatedCosts(CONFIG, "float32", "sdpa", "cpu").pointwise_weight == 128.0
    with pytest.raises(ValueError, match="no machine balance for device type 'mps'"):
        pointwise_weight_for("mps")


@pytest.mark.slow
def test_the_same_budget_gives_the_same_plan_twice_and_once_simulated(no_clock):
    first = MeasuredCosts(build_model(CONFIG, "sdpa"))
    second = MeasuredCosts(build_model(CONFIG, "sdpa"))
    simulated = SimulatedCosts(CONFIG, "float32", "sdpa", "cpu")
    a, b, c = (s.costs(*SHAPE) for s in (first, second, simulated))
    def objective(costs):
        return [[costs.cost(i, o) for o in range(len(costs.options))] for i in range(costs.n_blocks)]

    assert objective(a) == objective(b) == objective(c)
    plans = _plans(first)
    assert plans == _plans(second) == _plans(simulated)
    assert len(set(plans)) > 2  # the budgets reach different plans: the equality is not trivially all-none


@pytest.mark.slow
def test_simulate_reads_budget_like_a_suite(capsys):
    """``--budget 0.8`` is a fraction (it was read as 0.8 bytes), as in a suite (``min`` and ``min + N%`` are read by
    the same ``BudgetSpec.parse``); a bad one is refused before anything runs, naming ``--budget``."""
    args = ["simulate", "--model", "tiny", "--seq", "512", "--batch", "1", "--dtype", "fp32", "--kernel", "sdpa", "--target", "cpu"]
    for budget, spec in (("0.8", 0.8),):
        assert main([*args, "--budget", budget]) == 0
        out = capsys.readouterr().out
        expected = simulate_step("tiny", "fp32", 1, 512, "sdpa", "budget", target="cpu", budget=spec)
        assert "predicted peak: " in out and f"({expected.peak_bytes} bytes)" in out, out
    assert main([*args, "--budget", "2.5"]) == 2
    err = capsys.readouterr().err
    assert "--budget: 2.5 is neither a fraction in (0, 1] nor a whole number of bytes" in err
