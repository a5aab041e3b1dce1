"""Matmul FLOPs of one Llama training step in closed form: what ``FlopCounterMode`` counts (2 FLOPs per
multiply-add; attention without the causal half, as PyTorch's formulas count it).

Per block forward: 2*B*T*(C*C + 2*C*kv + C*C) for q, k, v, o (kv = n_kv_head * head_dim: grouped-query attention
makes k and v narrower) plus 2*B*T*3*C*I for gate, up and down (the SwiGLU width I), and 4*B*T^2*C for attention
(PyTorch counts GQA with the query heads: the kernel broadcasts k and v). Backward: 2x forward for the Linears and
for math attention (eager), 2.5x for a fused kernel (it recomputes the scores). Head: 2*B*T*C*V forward, 3x in
all. Recomputation: a checkpointed block replays its forward but stops before ``down_proj`` (its input is the last
tensor the backward needs; the residual add after it saves nothing); the default ``selective_op`` policy
recomputes only the ``o`` projection (``activation.options.DEFAULT_RECOMPUTE_ROLES``).
"""

from __future__ import annotations

from pytest_flashckpt.config.model_card import LlamaConfig
from pytest_flashckpt.models.step_flops import step_matmul_flops


def expected_matmul_flops(
    config: LlamaConfig, batch_size: int, seq_len: int, strategy: str = "none", k: int = 2,
    fused_attention: bool = True, recompute_roles: tuple[str, ...] = ("o",),
) -> int:
    B, T, C, V, L = batch_size, seq_len, config.n_embd, config.vocab_size, config.n_layer
    kv, inner = config.kv_dim, config.intermediate_size
    widths = {"q": C * C, "k": C * kv, "v": C * kv, "o": C * C, "gate": C * inner, "up": C * inner, "down": inner * C}
    return step_matmul_flops(B, T, C, V, L, widths.values(), fused_attention=fused_attention, strategy=strategy, k=k,
                             replay_skips=widths["down"], recomputed=[widths[role] for role in recompute_roles])
