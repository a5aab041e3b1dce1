"""Checkpointing's CPU RNG states: ``torch.utils.checkpoint`` keeps ``torch.get_rng_state()`` (a tensor made outside
the dispatcher) per live checkpointed block. The cpu probe counts them, so it equals the allocator's events, and the
simulator on a CPU target counts them alike."""

import pytest
import torch

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.models import GPTConfig, build_model
from pytest_flashckpt.probes.allocator import allocator_added_peak
from pytest_flashckpt.probes.cpu import LiveTensorProbe
from pytest_flashckpt.simulate import simulate_step
from pytest_flashckpt.training import Trainer

CONFIG = GPTConfig(vocab_size=211, block_size=128, n_layer=3, n_head=3, n_embd=48)  # odd sizes


class _Blind(LiveTensorProbe):
    class mode_class(LiveTensorProbe.mode_class):
        def __init__(self, device_type="cpu"):
            super().__init__(device_type)
            self.count_rng_states = False


def _trainer(strategy: str) -> Trainer:
    model = build_model(CONFIG, "sdpa", seed=1)
    apply_ac(model, ActivationConfig(strategy=strategy))
    trainer = Trainer.create(model, batch_size=2, seq_len=96, seed=3)
    trainer.train_step()
    return trainer


def _forward_backward(trainer: Trainer) -> None:
    x, y = trainer.batch()
    trainer.model(x, y).backward()
    trainer.optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("strategy", ["full", "selective_op", "none"])
def test_probe_equals_the_allocator_with_the_rng_states_counted(strategy):
    trainer = _trainer(strategy)
    state_bytes = torch.get_rng_state().untyped_storage().nbytes()
    with LiveTensorProbe().track(trainer.state_tensors()) as reading:
        _forward_backward(trainer)
    allocator = allocator_added_peak(lambda: _forward_backward(trainer))
    taken = reading.extra.get("rng_state_bytes", 0)
    # one state per block in its forward, one more per block while it recomputes (fork_rng)
    assert taken == (0 if strategy == "none" else 2 * CONFIG.n_layer * state_bytes)
    assert 0 <= allocator - reading.added_peak_bytes <= 64  # the rest: 0-dim scalars made outside the dispatcher
    # not counting them, the probe reads short by the states alive at its peak (one per block not yet recomputed)
    with _Blind().track(trainer.state_tensors()) as blind:
        _forward_backward(trainer)
    short = reading.peak_bytes - blind.peak_bytes
    assert short % state_bytes == 0 and (short > 0) == (strategy != "none")


def test_a_state_counts_while_it_is_alive_and_not_after():
    with LiveTensorProbe().track() as reading:
        state = torch.get_rng_state()
        nbytes = state.untyped_storage().nbytes()
        del state
    assert reading.peak_bytes == nbytes and reading.end_bytes == 0 and reading.extra["rng_state_bytes"] == nbytes
    assert torch.get_rng_state.__module__ == "torch.random"  # the wrapper is gone once tracking ends


def test_the_simulated_cpu_peak_counts_them_alike():
    measured = _trainer("full")
    with LiveTensorProbe().track(measured.state_tensors()) as reading:
        measured.train_step()
    cpu = simulate_step(CONFIG, "float32", 2, 96, "sdpa", "full", target="cpu")
    assert cpu.peak_bytes == reading.peak_bytes
    assert sum(cpu.breakdown.values()) == cpu.peak_bytes
