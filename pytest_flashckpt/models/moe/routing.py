"""The family's one routing hook: which tokens each routed expert runs, for the real step and the simulated one.

A learned router's choice is data: Hugging Face Mixtral finds an expert's tokens with ``torch.where(expert_mask)``,
whose result size depends on tensor values, so it cannot run on ``meta`` (or fake) tensors, and the simulator
could not tell how large each expert's activations are. The MoE layer therefore never dispatches by itself: it
asks ``expert_tokens`` for every expert's token indices, and the card's ``routing`` answers (``config.cards.moe``):

- ``balanced`` / ``capacity``: the per-expert counts are ``MoEConfig.expert_loads`` (known from the token count
  alone) and the indices are laid out deterministically with ``torch.arange`` (sizes known on ``meta`` too): the
  ``tokens * top_k`` assignments are numbered expert by expert and assignment ``s`` goes to token ``s mod
  tokens``. An expert holds at most ``tokens`` consecutive assignments, so it never sees a token twice, and each
  token is assigned exactly ``top_k`` times, to ``top_k`` different experts: a routing a top-k router could have
  produced. Measured on a CPU and simulated on ``meta``, the step runs the same ops on tensors of the same sizes,
  which is why the two agree to the byte.
- ``learned``: the router's top-k choice (``selected``), found with ``torch.where`` as Hugging Face does; real
  devices only.

The routing weights are read from the router's probabilities at the (token, expert) pairs chosen either way, so
the router is trained (it gets gradients) under a forced routing too.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import is_fake

from pytest_flashckpt.config.cards.moe import MoEConfig


def expert_tokens(config: MoEConfig, selected: torch.Tensor, tokens: int) -> list[torch.Tensor]:
    """The token indices (int64, ascending within an expert for ``learned``) each of ``config.n_experts`` experts
    runs in one MoE layer; ``selected``: the router's top-k expert ids, (tokens, top_k), used by ``learned`` only."""
    if config.routing == "learned":
        if selected.device.type == "meta" or is_fake(selected):
            raise ValueError(
                f"model card {config.name!r}: routing: learned dispatches tokens by their values (torch.where), which "
                "a meta or fake tensor has not; simulate with routing: balanced or routing: capacity"
            )
        return [torch.where((selected == e).any(dim=-1))[0] for e in range(config.n_experts)]
    indices, start = [], 0
    for load in config.expert_loads(tokens):
        indices.append(torch.arange(start, start + load, device=selected.device) % tokens)
        start += load
    return indices

