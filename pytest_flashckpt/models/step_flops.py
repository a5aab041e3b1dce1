"""The closed form shared by every family's matmul FLOP formula (``FlopCounterMode``'s count of one step).

A family gives a block's Linear widths by role (multiply-adds per token of each projection, ``BlockFlopShape``);
the rest is the same for every decoder block: 2 FLOPs per multiply-add, attention ``4*B*T^2*C`` forward without
the causal half, backward 2x the forward for Linears and plain matmul attention, 2.5x for a fused kernel (it
recomputes the scores), the head ``2*B*T*C*V`` forward and 3x in all, and what each block replays in the backward
pass (``BlockReplay``, read from the strategy's plan by ``activation.flops``: no strategy is named here). A
replayed block stops before its last projection (``replay_skips``): autograd saves an op's inputs before running
it, non-reentrant checkpointing stops the replay at the last saved tensor, and that projection's input is it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence


@dataclass(frozen=True)
class BlockFlopShape:
    """One block of a family, as the closed form reads it: each projection's multiply-adds per token by anatomy role
    (``qkv``, ``o``, ``up``, ``down``, ...) and the width a replayed block does not replay (0: the whole block)."""

    widths: Mapping[str, int]
    replay_skips: int = 0


@dataclass(frozen=True)
class BlockReplay:
    """What one block recomputes in the backward pass: its whole forward (``whole``), or the matmuls of ``roles``
    (a selective policy), or nothing (the default)."""

    whole: bool = False
    roles: tuple[str, ...] = ()


def step_matmul_flops(
    B: int, T: int, C: int, V: int, shape: BlockFlopShape, replays: Sequence[BlockReplay], *, fused_attention: bool,
) -> int:
    """FLOPs of one forward + backward of ``len(replays)`` blocks of ``shape`` and the head; ``replays``: each block's
    recomputation."""
    L = len(replays)
    linear_fwd = 2 * B * T * sum(shape.widths.values())
    attn_fwd = 4 * B * T * T * C
    block_fwd = linear_fwd + attn_fwd
    block_bwd = 2 * linear_fwd + (attn_fwd * 5 // 2 if fused_attention else 2 * attn_fwd)
    head_fwd = 2 * B * T * C * V
    total = L * (block_fwd + block_bwd) + 3 * head_fwd
    for replay in replays:
        if replay.whole:
            total += block_fwd - 2 * B * T * shape.replay_skips
        else:
            total += sum(2 * B * T * recomputed_width(shape, role) for role in replay.roles)
    return total


def recomputed_width(shape: BlockFlopShape, role: str) -> int:
    """Multiply-adds per token a selective replay spends on recomputing ``role``'s matmul: its width, except the last
    projection's (``down``) that the replay skips when no backward reads its output (``replay_skips``); 0 for a role
    the block does not have (a MoE block without a shared expert has no ``down``)."""
    width = shape.widths.get(role, 0)
    return width - shape.replay_skips if role == "down" and shape.replay_skips else width
