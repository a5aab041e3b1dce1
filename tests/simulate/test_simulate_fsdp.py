"""FSDP per-rank sharding: the dim-0 formula equals the real ``fully_shard`` layout; per-rank peaks."""

import pytest
import torch
from fsdp_layout_probe import layout as fully_shard_layout

from pytest_flashckpt.models import GPTConfig
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.simulate import simulate_step
from pytest_flashckpt.simulate.fsdp import shard_bytes, sharded_param_bytes
from simulated_steps import simulated

WORLD_SIZES = (3, 8)


@pytest.fixture(scope="module")
def layouts() -> dict[int, dict]:
    """``fully_shard``'s layout of tiny at each world size, in this process: a fresh model under a fresh fake
    process group per world size (``fsdp_layout_probe.layout`` asserts none is up before and destroys its own), so
    no fresh interpreter and its torch import."""
    by_size = {n: fully_shard_layout("tiny", n) for n in WORLD_SIZES}
    assert not torch.distributed.is_initialized()
    return by_size


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_formula_equals_fully_shard_layout(world_size, layouts):
    """Rank 0 holds the largest shard; 3 and 8 do not divide every dim 0 of tiny (2048, 768, 256), so padding
    (ceil) is exercised."""
    layout = layouts[world_size]
    model = build_model(load_card("tiny"), "eager", "meta", torch.bfloat16)
    names = dict(model.named_parameters())
    assert set(layout) == set(names)
    for name, (shape, storage_bytes, _local_bytes) in layout.items():
        assert shard_bytes(tuple(shape), 2, world_size) == storage_bytes, name
    assert sharded_param_bytes(model, world_size)[1] == sum(v[1] for v in layout.values())


@pytest.mark.slow
def test_per_rank_peak_shards_states_and_splits_batch():
    per_rank_batch = simulated("tiny", "bf16", 2, 512, "flash", "none")
    rank = simulated("tiny", "bf16", 4, 512, "flash", "none", world_size=2)
    s = rank.sharding
    assert rank.breakdown["parameters"] == s["parameter_bytes_per_rank"] == per_rank_batch.breakdown["parameters"] // 2
    assert rank.start_bytes == per_rank_batch.start_bytes // 2  # parameters and AdamW moments, halved
    # same moment (the loss backward): the batch's activations in full, the shards, and the all-gathered parameters
    assert rank.peak_op == per_rank_batch.peak_op
    assert rank.breakdown["activations"] == per_rank_batch.breakdown["activations"]
    assert rank.peak_bytes == per_rank_batch.peak_bytes - per_rank_batch.start_bytes // 2 + s["all_gathered_bytes"]
    assert sum(rank.breakdown.values()) == rank.peak_bytes


def test_rank_peak_can_move_to_another_moment():
    """Unsharded, the full step of tiny at a short sequence peaks in the optimizer step; a rank's optimizer step
    works on shards, so the rank's peak moves into the backward pass."""
    single = simulated("tiny", "bf16", 1, 128, "flash", "full")
    rank = simulated("tiny", "bf16", 8, 128, "flash", "full", world_size=8)
    assert single.peak_phase == "optimizer" and rank.peak_phase == "backward"


# Many small blocks under a small root: the root's and two blocks' parameters are fewer bytes than the shards'
# AdamW temporaries, so a rank of two peaks in the optimizer step. Every dim 0 is even: a rank holds exactly half.
SMALL_BLOCKS = GPTConfig(vocab_size=256, block_size=64, n_layer=12, n_head=2, n_embd=64, dropout=0.0, bias=True)


def _halved_sharded(peak) -> dict[str, int]:
    """``peak``'s breakdown with everything but activations halved: an optimizer moment of a rank of two (its
    parameters, gradients, AdamW state and the step's temporaries are shards; the token batch is whole)."""
    return {c: v if c == "activations" else v // 2 for c, v in peak.breakdown.items()}


@pytest.mark.slow
def test_optimizer_step_counts_no_all_gathered_parameters():
    """By the optimizer step FSDP2 has resharded every parameter: the rank holds the single process's optimizer
    moment (at the rank's batch) with its sharded categories halved, and nothing gathered. The old model added the
    all-gathered root and two blocks there as well."""
    single = simulated(SMALL_BLOCKS, "bf16", 1, 32, "flash", "full")
    rank = simulated(SMALL_BLOCKS, "bf16", 2, 32, "flash", "full", world_size=2)
    assert single.peak_phase == rank.peak_phase == "optimizer"
    assert rank.sharding["all_gathered_bytes"] > 0  # control: there are gathered bytes the optimizer could count
    assert rank.breakdown == _halved_sharded(single)
    assert rank.peak_bytes == sum(rank.breakdown.values())


def test_rank_peak_is_the_larger_of_the_backward_with_gathered_and_the_optimizer_without():
    """tiny, 1 x 128 per rank of two: the optimizer window is larger than the backward's shards and activations
    but smaller than those plus the gathered parameters, so the rank peaks in the backward. (The old model took
    the optimizer moment and put the gathered bytes on top of it: a peak in the optimizer step, larger than both.)"""
    single = simulated("tiny", "bf16", 1, 128, "flash", "full")
    rank = simulated("tiny", "bf16", 2, 128, "flash", "full", world_size=2)
    gathered = rank.sharding["all_gathered_bytes"]
    optimizer_window = sum(_halved_sharded(single).values())
    assert single.peak_phase == "optimizer" and rank.peak_phase == "backward"
    assert rank.peak_bytes - gathered < optimizer_window < rank.peak_bytes
    assert rank.breakdown["temporaries"] >= gathered


def test_world_size_must_divide_batch():
    with pytest.raises(ValueError, match="world size 3 does not divide the batch size 8"):
        simulate_step("tiny", "bf16", 8, 128, "flash", "none", world_size=3)


def test_cli_says_an_optimizer_peak_holds_nothing_gathered():
    from pytest_flashckpt.simulate.cli import describe

    text = "\n".join(describe(simulated(SMALL_BLOCKS, "bf16", 2, 32, "flash", "full", world_size=2)))
    assert "the optimizer step runs on shards: none of the" in text and "includes" not in text
    text = "\n".join(describe(simulated("tiny", "bf16", 2, 128, "flash", "full", world_size=2)))
    assert "(FSDP: includes" in text  # control: a backward peak holds them
