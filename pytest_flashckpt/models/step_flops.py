"""The closed form shared by every family's matmul FLOP formula (``FlopCounterMode``'s count of one step).

A family gives a block's Linear widths (multiply-adds per token of each projection); the rest is the same for every
decoder block: 2 FLOPs per multiply-add, attention ``4*B*T^2*C`` forward without the causal half, backward 2x the
forward for Linears and plain matmul attention, 2.5x for a fused kernel (it recomputes the scores), the head
``2*B*T*C*V`` forward and 3x in all, and what each strategy replays (see the families' formulas for why a replay
stops before the block's last projection).
"""

from __future__ import annotations

import math
from typing import Iterable


def step_matmul_flops(
    B: int, T: int, C: int, V: int, L: int, widths: Iterable[int], *, fused_attention: bool, strategy: str, k: int,
    replay_skips: int, recomputed: Iterable[int],
) -> int:
    """``widths``: every projection's multiply-adds per token in one block; ``replay_skips``: the width a
    recomputed block does not replay (its last projection; 0 when the whole block replays); ``recomputed``: the
    widths ``selective_op`` recomputes."""
    linear_fwd = 2 * B * T * sum(widths)
    attn_fwd = 4 * B * T * T * C
    block_fwd = linear_fwd + attn_fwd
    block_bwd = 2 * linear_fwd + (attn_fwd * 5 // 2 if fused_attention else 2 * attn_fwd)
    head_fwd = 2 * B * T * C * V
    total = L * (block_fwd + block_bwd) + 3 * head_fwd
    replay = block_fwd - 2 * B * T * replay_skips
    if strategy == "full":
        total += L * replay
    elif strategy == "every_k":
        total += math.ceil(L / k) * replay
    elif strategy == "selective_op":
        total += L * sum(2 * B * T * w for w in recomputed)
    elif strategy not in ("none", "offload"):
        raise ValueError(f"unknown activation strategy {strategy!r}")
    return total
