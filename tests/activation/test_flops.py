"""Recomputation proven by counting FLOPs, not by timing: measured == closed form for every strategy."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.activation.expected_flops import expected_matmul_flops
from pytest_flashckpt.activation.flops import StepCount, count_step, counts_as_measured, measure_step_flops
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.config.step_impl import StepImpl
from pytest_flashckpt.models import GPTConfig, build_model
from pytest_flashckpt.training import Trainer, make_batch

B, T = 2, 32
STRATEGIES = ("none", "full", "every_k", "selective_op")


def config(dropout: float = 0.0) -> GPTConfig:
    return GPTConfig(vocab_size=128, block_size=64, n_layer=4, n_head=2, n_embd=32, dropout=dropout)


def measured(strategy: str, backend: str, dropout: float = 0.0):
    model = build_model(config(dropout), backend)
    apply_ac(model, ActivationConfig(strategy=strategy, k=2))
    return measure_step_flops(model, B, T)


def expected(strategy: str, backend: str, dropout: float = 0.0) -> int:
    fused = backend == "sdpa" and dropout == 0  # SDPA with dropout on a CPU runs the math path
    return expected_matmul_flops(config(dropout), B, T, strategy, 2, fused)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_measured_flops_equal_the_closed_form(strategy, backend, dropout):
    assert measured(strategy, backend, dropout).matmul_flops == expected(strategy, backend, dropout)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_recompute_ordering_and_the_four_thirds_bound(backend):
    flops = {s: measured(s, backend) for s in STRATEGIES}
    none = flops["none"]
    full = flops["full"].ratio(none)
    # One extra forward of the blocks only (embeddings, head and loss are not replayed): under 4/3, and exactly
    # the closed form's ratio.
    assert full == pytest.approx(expected("full", backend) / expected("none", backend), rel=1e-12)
    assert 1.15 < full < 4 / 3
    assert 1.0 < flops["every_k"].ratio(none) < full
    selective = flops["selective_op"]
    assert 1.0 < selective.ratio(none) < flops["every_k"].ratio(none)
    # what FlopCounterMode cannot see: the pointwise ops selective checkpointing replays
    assert selective.pointwise_elements > none.pointwise_elements
    assert selective.op_calls["aten.gelu"] == 2 * none.op_calls["aten.gelu"] == 2 * 4


def test_dropout_makes_full_recompute_replay_the_whole_block():
    with_dropout = measured("full", "eager", 0.1).matmul_flops - measured("none", "eager", 0.1).matmul_flops
    without = measured("full", "eager").matmul_flops - measured("none", "eager").matmul_flops
    d = config().n_embd
    assert with_dropout - without == 4 * 2 * B * T * 4 * d * d  # mlp.c_proj's matmul, once per block


def test_cpu_flash_kernel_is_counted():
    """PyTorch's registry has no formula for the CPU flash kernel; without ours its FLOPs would be zero."""
    model = build_model(config(), "sdpa")
    x, y = make_batch(128, B, T, seed=0, position=0)
    plain = FlopCounterMode(display=False)
    with plain:
        model(x, y).backward()
    ours = measure_step_flops(build_model(config(), "sdpa"), B, T)
    attention_fwd = 4 * B * T * T * config().n_embd
    assert ours.matmul_flops - plain.get_total_flops() == config().n_layer * attention_fwd * 7 // 2


def _fresh_trainer(strategy: str, backend: str, dropout: float = 0.0, **create) -> Trainer:
    model = build_model(config(dropout), backend)
    apply_ac(model, ActivationConfig(strategy=strategy, k=2))
    return Trainer.create(model, B, T, **create)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_warm_up_steps_count_is_count_steps(strategy, backend, dropout):
    """The runner counts FLOPs around a fresh trainer's first step (runner.run._warm) instead of a forward + backward
    of its own: every field of that count is count_step's, which the closed form above checks."""
    first = _fresh_trainer(strategy, backend, dropout)
    assert counts_as_measured(first)
    counting = StepCount()
    torch.manual_seed(123)  # another RNG state than count_step's: dropout picks values, not ops
    first.train_step(counting)  # held around the forward and backward: no batch or AdamW op is counted
    assert counting.flops() == count_step(_fresh_trainer(strategy, backend, dropout))


def test_a_step_unlike_count_steps_is_counted_on_its_own():
    """Autocast, the chunked loss, a later data position or another trainer's step: count_step counts separately."""
    assert not counts_as_measured(_fresh_trainer("none", "sdpa", autocast=torch.bfloat16))
    assert not counts_as_measured(_fresh_trainer("none", "sdpa", impl=StepImpl(loss="chunked")))
    stepped = _fresh_trainer("none", "sdpa")
    stepped.train_step()
    assert not counts_as_measured(stepped)

    class OwnStep(Trainer):
        pass

    model = build_model(config(), "sdpa")
    assert not counts_as_measured(OwnStep.create(model, B, T))
