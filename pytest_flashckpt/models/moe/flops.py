"""Matmul FLOPs of one MoE training step in closed form, from the active parameters: what ``FlopCounterMode``
counts (2 FLOPs per multiply-add; attention without the causal half, as PyTorch's formulas count it).

A routed expert runs only its own tokens, and under every routing the experts of a layer see ``tokens * top_k``
tokens in all (``MoEConfig.expert_loads``: balanced or skewed by a capacity factor, the sum is the same), so per
token a block's Linears cost what its *active* weights are: q, k, v, o (grouped-query k and v narrower), the
router (C x n_experts), ``top_k`` experts' gate, up and down (3*C*I each), and the shared expert (3*C*I_shared)
and its gate (C x 1) where the card has them. The rest is the closed form every family shares
(``models.step_flops``): 4*B*T^2*C attention forward, backward 2x (2.5x for a fused kernel), the head 3x.

Recomputation: a checkpointed block replays its whole forward. Unlike Llama's (whose replay stops before
``down_proj``, the last tensor its backward needs being that projection's input), a MoE block's last matmul
output is needed: each expert's output is multiplied by its routing weight (whose gradient reads it), and so is
the gated shared expert's; only a shared expert without a gate, added as it is, ends the block on a projection
whose output the backward does not read, and that one is not replayed. ``selective_op`` recomputes the ``o`` and
``down`` projections (``activation.options.DEFAULT_RECOMPUTE_ROLES``): ``down`` is the shared expert's, free where
the replay skips it (``models.step_flops.recomputed_width``); the routed experts' ``expert_down`` stays saved.
"""

from __future__ import annotations

from pytest_flashckpt.config.cards.moe import MoEConfig
from pytest_flashckpt.models.step_flops import BlockFlopShape


def block_widths(config: MoEConfig) -> dict[str, int]:
    """Multiply-adds per token of each role of a block (the routed experts' summed over the ``top_k`` a token uses)."""
    C, kv, top_k = config.n_embd, config.kv_dim, config.top_k
    expert, shared = config.expert_intermediate_size, config.shared_expert_intermediate_size
    widths = {"q": C * C, "k": C * kv, "v": C * kv, "o": C * C, "router": C * config.n_experts,
              "expert_gate": top_k * C * expert, "expert_up": top_k * C * expert, "expert_down": top_k * expert * C}
    if shared:
        widths.update(gate=C * shared, up=C * shared, down=shared * C)
    if config.shared_expert_gate:
        widths["shared_expert_gate"] = C
    return widths


def moe_flop_shape(config: MoEConfig) -> BlockFlopShape:
    """The block as the shared closed form reads it: the active widths by role; a replayed block replays its whole
    forward, except the last projection of a shared expert without a gate (the module docstring)."""
    widths = block_widths(config)
    ungated_shared_down = widths["down"] if "down" in widths and "shared_expert_gate" not in widths else 0
    return BlockFlopShape(widths, replay_skips=ungated_shared_down)
