"""Matmul FLOPs of one Llama training step in closed form: what ``FlopCounterMode`` counts (2 FLOPs per
multiply-add; attention without the causal half, as PyTorch's formulas count it).

Per block forward: 2*B*T*(C*C + 2*C*kv + C*C) for q, k, v, o (kv = n_kv_head * head_dim: grouped-query attention
makes k and v narrower) plus 2*B*T*3*C*I for gate, up and down (the SwiGLU width I), and 4*B*T^2*C for attention
(PyTorch counts GQA with the query heads: the kernel broadcasts k and v). Backward: 2x forward for the Linears and
for math attention (eager), 2.5x for a fused kernel (it recomputes the scores). Head: 2*B*T*C*V forward, 3x in
all. Recomputation: a checkpointed block replays its forward but stops before ``down_proj`` (its input is the last
tensor the backward needs; the residual add after it saves nothing); the default ``selective_op`` policy
recomputes only the ``o`` projection (``activation.selective.DEFAULT_RECOMPUTE_ROLES``).
"""

from __future__ import annotations

import math

from pytest_flashckpt.config.model_card import LlamaConfig


def expected_matmul_flops(
    config: LlamaConfig, batch_size: int, seq_len: int, strategy: str = "none", k: int = 2,
    fused_attention: bool = True, recompute_roles: tuple[str, ...] = ("o",),
) -> int:
    B, T, C, V, L = batch_size, seq_len, config.n_embd, config.vocab_size, config.n_layer
    kv, inner = config.kv_dim, config.intermediate_size
    widths = {"q": C * C, "k": C * kv, "v": C * kv, "o": C * C, "gate": C * inner, "up": C * inner, "down": inner * C}
    linear_fwd = 2 * B * T * sum(widths.values())
    attn_fwd = 4 * B * T * T * C
    block_fwd = linear_fwd + attn_fwd
    block_bwd = 2 * linear_fwd + (attn_fwd * 5 // 2 if fused_attention else 2 * attn_fwd)
    head_fwd = 2 * B * T * C * V
    total = L * (block_fwd + block_bwd) + 3 * head_fwd
    replay = block_fwd - 2 * B * T * widths["down"]
    if strategy == "full":
        total += L * replay
    elif strategy == "every_k":
        total += math.ceil(L / k) * replay
    elif strategy == "selective_op":
        total += L * sum(2 * B * T * widths[role] for role in recompute_roles)
    elif strategy not in ("none", "offload"):
        raise ValueError(f"unknown activation strategy {strategy!r}")
    return total
