"""The Llama block as the matmul FLOP closed form reads it (``models.step_flops``).

Per block: q, k, v, o (``kv = n_kv_head * head_dim``: grouped-query attention makes k and v narrower; PyTorch counts
GQA attention with the query heads, the kernel broadcasts k and v) and the SwiGLU's gate, up and down (width
``intermediate_size``). A checkpointed block replays its forward but stops before ``down_proj`` (its input is the
last tensor the backward needs; the residual add after it saves nothing).
"""

from __future__ import annotations

from pytest_flashckpt.config.cards.llama import LlamaConfig
from pytest_flashckpt.models.step_flops import BlockFlopShape


def llama_flop_shape(config: LlamaConfig) -> BlockFlopShape:
    C, kv, inner = config.n_embd, config.kv_dim, config.intermediate_size
    widths = {"q": C * C, "k": C * kv, "v": C * kv, "o": C * C, "gate": C * inner, "up": C * inner, "down": inner * C}
    return BlockFlopShape(widths, replay_skips=widths["down"])
