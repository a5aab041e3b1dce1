"""The GPT block as the matmul FLOP closed form reads it (``models.step_flops``).

Four Linears: ``attn.c_attn`` (3C outputs), ``attn.c_proj`` (C), ``mlp.c_fc`` (4C) and ``mlp.c_proj`` (C from 4C),
24*C^2 multiply-adds per token. Without dropout a recomputed block stops before ``mlp.c_proj`` (its input is the
last saved tensor; the residual add after it saves nothing); with dropout the mask after it is saved too, so the
whole block forward is replayed.
"""

from __future__ import annotations

from pytest_flashckpt.config.cards.gpt import GPTConfig
from pytest_flashckpt.models.step_flops import BlockFlopShape


def gpt_flop_shape(config: GPTConfig) -> BlockFlopShape:
    C = config.n_embd
    widths = {"qkv": 3 * C * C, "o": C * C, "up": 4 * C * C, "down": 4 * C * C}
    return BlockFlopShape(widths, replay_skips=0 if config.dropout > 0 else widths["down"])
