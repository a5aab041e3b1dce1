"""FSDP2 per-rank memory, modelled: the route kept where the real engine under fake mode (``simulate.fake_ranks``,
what ``flashckpt simulate --world-size N`` and the simulate suite's FSDP rows use) does not run: a Hugging Face
config, the budget strategy, another kernel, target, norm, optimizer or loss (``simulate.layouts.engine_cannot_run``),
and the distributed report's simulated column for measured runs (``report.distributed``).

``fully_shard`` keeps each parameter (and its gradient and AdamW state) as a dim-0
shard: every rank holds ``ceil(dim0 / N)`` rows (the sharded parameter is padded to that on every rank, so the
largest rank's share is exactly this). ``tests/simulate/test_fsdp.py`` checks this formula against the real
``fully_shard`` layout on meta with a fake process group.

A rank's step: the single-device step simulated at the rank's batch (``batch / N``) with the probe's rank view
(``simulate.probe``: parameters, optimizer state, accumulated gradients and the optimizer step's temporaries
count 1/N, tracked at every op, so the rank's peak may fall at another moment than the unsharded one), plus what
FSDP2 all-gathers (modelled, not measured): the root module's parameters (embeddings, final LayerNorm: the root
is not resharded after forward) and two blocks' parameters (the one running and the one prefetched), in the
forward and backward only. By the optimizer step FSDP2 has resharded every parameter (each block after its
backward, the root at the end of backward), so the optimizer step counts none (on gloo ranks its window starts at
exactly the local state plus the local gradients). The gathered bytes join the rank's live count when the step
starts and leave it when the optimizer step starts, so the rank's peak is the larger of the two windows. NCCL's
communication buffers are not counted.
"""

from __future__ import annotations

import math
import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle

from pytest_flashckpt.models.anatomy import get_blocks


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


def all_gathered_bytes(model: nn.Module) -> int:
    """What FSDP2 holds unsharded on top of the shards (modelled): the root module's parameters (not resharded
    after forward) and two blocks' (the one running and the one prefetched)."""
    blocks = get_blocks(model)
    block_params = max(_unsharded(block.parameters()) for block in blocks)
    in_blocks = {id(p) for block in blocks for p in block.parameters()}
    root_params = _unsharded(p for p in model.parameters() if id(p) not in in_blocks)
    return root_params + 2 * block_params


GATHERED_PHASES = ("forward", "backward")  # the optimizer step runs on the local shards only


def gathered_in(phase: str, all_gathered: int) -> int:
    """The modelled all-gathered bytes a rank holds in ``phase`` (``all_gathered_bytes`` in the forward and backward,
    none in the optimizer step)."""
    return all_gathered if phase in GATHERED_PHASES else 0


def hold_gathered(probe, optimizer: torch.optim.Optimizer, nbytes: int) -> RemovableHandle:
    """Count ``nbytes`` of all-gathered parameters in ``probe``'s rank view (``simulate.probe.AttributedStorages``)
    from now (the step's start: the root's pre-forward all-gather) until ``optimizer``'s step starts (every
    parameter resharded). No storage stands for them on ``meta``, so they are added to the rank's live count itself:
    a forward or backward moment peaks with them, an optimizer moment without. Remove the returned handle after
    the step."""
    probe._rank_add(nbytes)
    return optimizer.register_step_pre_hook(lambda *_: probe._rank_add(-nbytes))
