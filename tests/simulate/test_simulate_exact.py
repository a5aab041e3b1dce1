"""The simulated peak (meta device) equals the cpu probe's measured peak of the same real CPU step, to the byte."""

import pytest
import torch

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.probes.cpu import LiveTensorProbe
from pytest_flashckpt.simulate import simulate_step
from pytest_flashckpt.training import Trainer

STRATEGIES = ("none", "full", "every_k", "selective_op")


def measured_cpu_peak(card, backend: str, strategy: str, batch: int, seq: int) -> tuple[int, int]:
    """The runner's measurement: one warm-up step, then the cpu probe around the next step."""
    model = build_model(load_card(card) if isinstance(card, str) else card, backend, "cpu", torch.float32)
    if strategy != "none":
        apply_ac(model, ActivationConfig(strategy=strategy))
    trainer = Trainer.create(model, batch, seq)
    trainer.train_step()
    with LiveTensorProbe().track(trainer.state_tensors()) as reading:
        trainer.train_step()
    return reading.peak_bytes, reading.start_bytes


@pytest.mark.parametrize("kernel", ["sdpa", pytest.param("eager", marks=pytest.mark.slow)])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_tiny_simulated_equals_measured(strategy, kernel):
    peak, start = measured_cpu_peak("tiny", kernel, strategy, 1, 256)
    sim = simulate_step("tiny", "float32", 1, 256, kernel, strategy, target="cpu")
    assert (sim.peak_bytes, sim.start_bytes) == (peak, start)
    assert sum(sim.breakdown.values()) == sim.peak_bytes


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy", [pytest.param(s, marks=() if s == "full" else pytest.mark.slow) for s in STRATEGIES]
)
def test_small_simulated_equals_measured(strategy):
    peak, start = measured_cpu_peak("small", "sdpa", strategy, 1, 128)
    sim = simulate_step("small", "float32", 1, 128, "sdpa", strategy, target="cpu")
    assert (sim.peak_bytes, sim.start_bytes) == (peak, start)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "kernel"),
    [("none", "sdpa"), *(pytest.param(s, k, marks=pytest.mark.slow) for s, k in (("full", "sdpa"), ("none", "eager"), ("full", "eager")))],
)
def test_tiny_with_dropout_simulated_equals_measured(strategy, kernel):
    """With dropout, SDPA on a CPU takes its math path (the simulator then runs meta's SDPA, which is math too);
    dropout masks and checkpointing's RNG replay behave on meta as on the CPU."""
    card = load_card("tiny", dropout=0.1)
    peak, start = measured_cpu_peak(card, kernel, strategy, 1, 256)
    sim = simulate_step(card, "float32", 1, 256, kernel, strategy, target="cpu")
    assert (sim.peak_bytes, sim.start_bytes) == (peak, start)


def test_host_step_counters_are_the_only_cpu_meta_difference():
    """AdamW's step counters are CPU tensors even for meta (and CUDA) parameters: a cpu prediction counts them,
    a cuda one does not. Everything else is the same step."""
    model = build_model(load_card("tiny"), "sdpa", "meta", torch.float32)
    n_params = len(list(model.parameters()))
    cpu = simulate_step("tiny", "float32", 2, 64, "sdpa", "none", target="cpu")
    assert cpu.host_bytes == n_params * 4  # one float32 counter per parameter
