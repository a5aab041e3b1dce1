"""The simulated block, the analytic model and Korthikanti's formula, differences accounted to the byte."""

import pytest
import torch

from pytest_flashckpt.activation import analytic
from pytest_flashckpt.models.cards import load_card
from pytest_flashckpt.simulate.formulas import FLASH_RNG_STATE_BYTES, korthikanti_terms
from simulated_steps import simulated


def test_flash_block_is_korthikanti_minus_explained_terms():
    config = load_card("tiny")
    sim = simulated(config, "bf16", 2, 256, "flash", "none")
    assert set(sim.block_kept_bytes) == {sum(korthikanti_terms(config, 2, 256, flash=True).values())}


@pytest.mark.slow
@pytest.mark.parametrize(("kernel", "target", "dtype", "backend"), [("sdpa", "cpu", "fp32", "sdpa"), ("eager", "cpu", "fp32", "eager"), ("eager", "cuda", "bf16", "eager")])
@pytest.mark.parametrize("strategy", ["none", "full", "selective_op"])
def test_analytic_block_bytes_equal_simulated(kernel, target, dtype, backend, strategy):
    config = load_card("tiny")
    sim = simulated(config, dtype, 1, 128, kernel, strategy, target=target)
    work = analytic.Workload(1, 128, backend, 4 if dtype == "fp32" else 2, target)
    # a checkpointed block also keeps torch.utils.checkpoint's CPU RNG state, device memory on a CPU target only
    rng = torch.get_rng_state().untyped_storage().nbytes() if target == "cpu" and strategy != "none" else 0
    assert sim.block_kept_bytes == tuple(b + rng for b in analytic.estimate(config, work, strategy).block_bytes)


def test_analytic_flash_block_misses_only_the_rng_state():
    config = load_card("tiny")
    sim = simulated(config, "bf16", 1, 128, "flash", "none")
    work = analytic.Workload(1, 128, "flash_attn", 2, "cuda")
    assert sim.block_kept_bytes[0] - analytic.block_bytes(config, work, "none") == FLASH_RNG_STATE_BYTES
