"""FSDP2 per-rank memory: ``fully_shard`` keeps each parameter (and its gradient and AdamW state) as a dim-0
shard: every rank holds ``ceil(dim0 / N)`` rows (the sharded parameter is padded to that on every rank, so the
largest rank's share is exactly this). ``tests/simulate/test_fsdp.py`` checks this formula against the real
``fully_shard`` layout on meta with a fake process group.

A rank's step: the simulated single-device step at the rank's batch (``batch / N``), with the parameters,
gradients and optimizer state at its peak replaced by their shards, plus what FSDP2 all-gathers (modelled, not
measured): the root module's parameters (embeddings, final LayerNorm: the root is not resharded after forward)
and two blocks' parameters (the one running and the one prefetched). Communication buffers of NCCL are not
counted.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch.nn as nn

from pytest_flashckpt.simulate.result import SimulatedPeak


def shard_bytes(shape: tuple[int, ...], itemsize: int, world_size: int) -> int:
    """Bytes of the largest rank's dim-0 shard of a tensor of ``shape`` (0-dim tensors are replicated)."""
    if not shape:
        return itemsize
    rows = math.ceil(shape[0] / world_size)
    return rows * math.prod(shape[1:]) * itemsize


def sharded_param_bytes(model: nn.Module, world_size: int) -> tuple[int, int]:
    """(full, per-rank) bytes of the model's parameters (tied parameters once)."""
    full = sharded = 0
    for p in model.parameters():
        full += p.numel() * p.element_size()
        sharded += shard_bytes(tuple(p.shape), p.element_size(), world_size)
    return full, sharded


def _unsharded(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def shard_peak(peak: SimulatedPeak, model: nn.Module, world_size: int) -> SimulatedPeak:
    """``peak`` (simulated at the rank's batch) as one FSDP2 rank sees it."""
    full, sharded = sharded_param_bytes(model, world_size)
    ratio = sharded / full
    breakdown = dict(peak.breakdown)
    saved = 0
    for category in ("parameters", "gradients", "optimizer_state"):
        before = breakdown[category]
        breakdown[category] = round(before * ratio) if category != "parameters" else sharded
        saved += before - breakdown[category]
    block_params = max(_unsharded(block.parameters()) for block in model.blocks)
    in_blocks = {id(p) for block in model.blocks for p in block.parameters()}
    root_params = _unsharded(p for p in model.parameters() if id(p) not in in_blocks)
    gathered = root_params + 2 * block_params
    breakdown["temporaries"] += gathered
    sharding = {
        "world_size": world_size,
        "parameter_bytes_full": full,
        "parameter_bytes_per_rank": sharded,
        "state_bytes_saved": saved,
        "all_gathered_bytes": gathered,
    }
    return replace(
        peak,
        peak_bytes=peak.peak_bytes - saved + gathered,
        start_bytes=round(peak.start_bytes * ratio),
        breakdown=breakdown,
        sharding=sharding,
    )
