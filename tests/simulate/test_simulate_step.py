"""simulate_step on meta: frees what it makes, breakdown adds up, kernel-specific saved tensors, dropout and
checkpointing on meta, the CUDA optimizer path, bad input."""

import pytest

from pytest_flashckpt.models.cards import load_card
from pytest_flashckpt.simulate import simulate_step
from simulated_steps import simulated


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["none", "full", "every_k", "selective_op"])
def test_meta_storages_are_freed_and_breakdown_adds_up(strategy):
    """The probe's weak references fire for meta storages too: after the step only the resident state is left."""
    peak = simulated("tiny", "bf16", 2, 128, "flash", strategy)
    assert peak.end_bytes == peak.start_bytes > 0
    assert sum(peak.breakdown.values()) == peak.peak_bytes
    assert peak.breakdown["parameters"] == load_card("tiny").num_params() * 2


@pytest.mark.slow
def test_flash_keeps_logsumexp_not_scores():
    config = load_card("tiny")
    b, s = 2, 256
    flash = simulated(config, "bf16", b, s, "flash", "none")
    eager = simulated(config, "bf16", b, s, "eager", "none")
    # eager keeps the softmax probabilities (a*s*s per sequence, 2 bytes) and the causal mask (s*s bools)
    assert eager.block_kept_bytes[0] - flash.block_kept_bytes[0] > config.n_head * s * s * b * 2
    assert flash.kernel == "sdpa-flash" and eager.kernel == "eager"


@pytest.mark.slow
def test_cuda_target_runs_the_foreach_adamw():
    cuda = simulated("tiny", "bf16", 1, 64, "flash", "full")
    cpu = simulated("tiny", "bf16", 1, 64, "sdpa", "full", target="cpu")
    assert cuda.peak_phase == cpu.peak_phase == "optimizer"
    assert cuda.peak_op.startswith("aten._foreach_") and not cpu.peak_op.startswith("aten._foreach_")
    assert cuda.host_bytes == 0 < cpu.host_bytes


@pytest.mark.slow
def test_dropout_and_checkpoint_rng_on_meta():
    """Dropout draws on meta (masks are meta tensors) and non-reentrant checkpointing replays it."""
    config = load_card("tiny", dropout=0.1)
    plain = simulated(config, "bf16", 1, 128, "flash", "none")
    no_dropout = simulated("tiny", "bf16", 1, 128, "flash", "none")
    assert plain.block_kept_bytes[0] > no_dropout.block_kept_bytes[0]  # residual dropout masks kept
    full = simulated(config, "bf16", 1, 128, "flash", "full")
    assert full.end_bytes == full.start_bytes


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kernel": "flash", "target": "cpu"}, "runs on CUDA only"),
        ({"kernel": "nope"}, "unknown attention kernel 'nope'"),
        ({"target": "tpu"}, "unknown simulation target 'tpu'"),
        ({"strategy": "offload"}, "offload"),
    ],
)
def test_bad_choices(kwargs, message):
    with pytest.raises(Exception, match=message):
        simulate_step("tiny", "bf16", 1, 64, **kwargs)


@pytest.mark.slow
def test_every_k_keeps_per_block_what_full_and_none_keep():
    """Per-block kept bytes are attributed block by block: every_k's blocks keep exactly what the same block keeps
    under full (checkpointed) or none, and selective_op sits between the two."""
    kept = {s: simulated("tiny", "bf16", 1, 128, "flash", s).block_kept_bytes for s in ("none", "full", "selective_op")}
    n = load_card("tiny").n_layer
    assert all(len(v) == n for v in kept.values())
    assert kept["full"][0] < kept["selective_op"][0] < kept["none"][0]
    every_k = simulated("tiny", "bf16", 1, 128, "flash", "every_k", k=2)
    assert every_k.block_kept_bytes == tuple(kept["full" if i % 2 == 0 else "none"][i] for i in range(n))
