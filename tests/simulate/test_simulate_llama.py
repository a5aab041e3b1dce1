"""The Llama family on the simulator: the meta step's peak equals the cpu probe's measured peak of the same real
CPU step to the byte (fp32, llama-tiny's odd sizes: 6 query heads over 2 KV heads), as for GPT in
test_simulate_exact.py; and the large cards answer "will it fit" without allocating anything."""

import pytest
import torch

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.probes.cpu import LiveTensorProbe
from pytest_flashckpt.simulate import simulate_step
from pytest_flashckpt.training import Trainer


def measured_cpu_peak(card: str, backend: str, activation: ActivationConfig, batch: int, seq: int) -> tuple[int, int]:
    model = build_model(load_card(card), backend, "cpu", torch.float32)
    if activation.strategy != "none":
        apply_ac(model, activation, shape=(batch, seq))
    trainer = Trainer.create(model, batch, seq)
    trainer.train_step()
    with LiveTensorProbe().track(trainer.state_tensors()) as reading:
        trainer.train_step()
    return reading.peak_bytes, reading.start_bytes


@pytest.mark.parametrize(
    ("strategy", "kernel"),
    [*((s, "sdpa") for s in ("none", "full", "every_k", "selective_op")),
     *(pytest.param(s, "eager", marks=pytest.mark.slow) for s in ("none", "full", "every_k", "selective_op"))],
)
def test_llama_tiny_simulated_equals_measured(strategy, kernel):
    peak, start = measured_cpu_peak("llama-tiny", kernel, ActivationConfig(strategy=strategy), 1, 128)
    sim = simulate_step("llama-tiny", "float32", 1, 128, kernel, strategy, target="cpu")
    assert (sim.peak_bytes, sim.start_bytes) == (peak, start)
    assert sum(sim.breakdown.values()) == sim.peak_bytes


@pytest.mark.slow
def test_llama_tiny_budget_plan_simulated_equals_measured():
    budget = "min + 30%"
    peak, start = measured_cpu_peak("llama-tiny", "sdpa", ActivationConfig(strategy="budget", budget=budget), 1, 128)
    sim = simulate_step("llama-tiny", "float32", 1, 128, "sdpa", "budget", target="cpu", budget=budget)
    assert (sim.peak_bytes, sim.start_bytes) == (peak, start)


def test_llama_blocks_keep_their_bytes_and_no_gpt_formula_is_applied():
    """Per-block kept bytes come from the simulated step; the GPT-only analytic model refuses a Llama card."""
    from pytest_flashckpt.activation import analytic

    sim = simulate_step("llama-tiny", "float32", 1, 64, "sdpa", "full", target="cpu")
    card = load_card("llama-tiny")
    assert len(sim.block_kept_bytes) == card.n_layer
    rng = torch.get_rng_state().untyped_storage().nbytes()  # the CPU RNG state checkpointing keeps (counted on a cpu target)
    assert set(sim.block_kept_bytes) == {64 * card.n_embd * 4 + rng}  # full: each block keeps only its input
    assert not analytic.supports(card)
    with pytest.raises(ValueError, match="covers the GPT family only"):
        analytic.estimate(card, analytic.Workload(1, 64))


@pytest.mark.slow
def test_will_llama3_8b_fit_at_8k_tokens_on_80_gib():
    """The question the issue brings: one GPU, batch 1 x 8192, bf16, CUDA flash kernel with 8 KV heads. Without
    checkpointing the step does not fit 80 GiB; with full checkpointing it does (the optimizer step peaks)."""
    gib80 = 80 * 2**30
    none = simulate_step("llama3-8b", "bf16", 1, 8192, "flash", "none")
    full = simulate_step("llama3-8b", "bf16", 1, 8192, "flash", "full")
    assert none.peak_bytes > gib80 > full.peak_bytes
    assert full.peak_phase == "optimizer"
    params = load_card("llama3-8b").num_params() * 2
    assert full.breakdown["parameters"] == params and full.breakdown["optimizer_state"] == 2 * params
