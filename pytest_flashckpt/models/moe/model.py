"""A readable Mixture-of-Experts decoder (Mixtral / Qwen-MoE style): the Llama block with its MLP replaced by a
routed MoE layer (a router, ``n_experts`` SwiGLU experts of which ``top_k`` run per token, an optional shared
expert every token passes through).

Attention, RMSNorm and the rotary tables are the Llama family's own (``models.llama.model``), with q/k/v biases
where the card says ``qkv_bias`` (Qwen). Module names follow Hugging Face's Qwen2-MoE inside a block
(``mlp.gate`` is the router, ``mlp.experts.<e>.{gate,up,down}_proj``, ``mlp.shared_expert.*``,
``mlp.shared_expert_gate``); ``anatomy()`` states them, the routed experts as one role per projection over all
experts (``mlp.experts.*.up_proj``).

Which tokens an expert runs is the family's routing hook's answer (``models.moe.routing.expert_tokens``, the card's
``routing``), never decided here, so the same step runs on a CPU and on ``meta``. A layer dispatches as Hugging
Face's eager Mixtral does: per expert, gather its tokens (``index_select``), run the expert, scale by the routing
weight, and add the result back in place (``index_add_``).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from pytest_flashckpt.config.cards.moe import MoEConfig
from pytest_flashckpt.models.anatomy import BlockAnatomy, ModelAnatomy
from pytest_flashckpt.models.llama.model import Attention, Llama, RMSNorm
from pytest_flashckpt.models.moe.routing import expert_tokens

__all__ = ["MoE", "MoEConfig", "moe_anatomy"]


def moe_block_anatomy(config: MoEConfig) -> BlockAnatomy:
    """A block's roles: attention's q/k/v/o, the ``router``, the routed ``expert_*`` projections of every expert,
    and the shared expert (if any) as a plain gated MLP's ``gate``/``up``/``down``."""
    projections = {
        "q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
        "router": "mlp.gate",
        "expert_gate": "mlp.experts.*.gate_proj", "expert_up": "mlp.experts.*.up_proj",
        "expert_down": "mlp.experts.*.down_proj",
    }
    if config.shared_expert_intermediate_size:
        projections.update(gate="mlp.shared_expert.gate_proj", up="mlp.shared_expert.up_proj",
                           down="mlp.shared_expert.down_proj")
    if config.shared_expert_gate:
        projections["shared_expert_gate"] = "mlp.shared_expert_gate"
    return BlockAnatomy(projections, attention="self_attn", norms=("input_layernorm", "post_attention_layernorm"))


def moe_anatomy(config: MoEConfig) -> ModelAnatomy:
    """The anatomy of a ``MoE`` built from ``config``."""
    tied = (("lm_head.weight", "embed_tokens.weight"),) if config.tie_word_embeddings else ()
    return ModelAnatomy("moe", "blocks", moe_block_anatomy(config), ("embed_tokens",), "lm_head", "norm", tied)


class GatedMLP(nn.Module):
    """SwiGLU of width ``hidden``: down(silu(gate(x)) * up(x)); one expert."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoEAttention(Attention):
    """The Llama family's attention, with biases on q, k and v where the card asks (``qkv_bias``)."""

    def __init__(self, config: MoEConfig, backend: str) -> None:
        super().__init__(config, backend)
        if config.qkv_bias:
            self.q_proj = nn.Linear(config.n_embd, config.n_embd, bias=True)
            self.k_proj = nn.Linear(config.n_embd, config.kv_dim, bias=True)
            self.v_proj = nn.Linear(config.n_embd, config.kv_dim, bias=True)


class MoELayer(nn.Module):
    """Router (``gate``), routed experts, optional shared expert; tokens per expert from ``routing.expert_tokens``."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.config = config
        self.gate = nn.Linear(config.n_embd, config.n_experts, bias=False)
        self.experts = nn.ModuleList(GatedMLP(config.n_embd, config.expert_intermediate_size) for _ in range(config.n_experts))
        if config.shared_expert_intermediate_size:
            self.shared_expert = GatedMLP(config.n_embd, config.shared_expert_intermediate_size)
        if config.shared_expert_gate:
            self.shared_expert_gate = nn.Linear(config.n_embd, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(-1, x.size(-1))
        probs = F.softmax(self.gate(h), dim=-1, dtype=torch.float32)  # routing weights in float32, as Mixtral's
        top, selected = torch.topk(probs, self.config.top_k, dim=-1)
        scale = top.sum(dim=-1) if self.config.norm_topk_prob else None
        out = torch.zeros_like(h)
        for e, (expert, idx) in enumerate(zip(self.experts, expert_tokens(self.config, selected, h.size(0)))):
            weight = probs[idx, e] if scale is None else probs[idx, e] / scale[idx]
            out.index_add_(0, idx, expert(h[idx]) * weight.unsqueeze(-1).to(h.dtype))
        if self.config.shared_expert_intermediate_size:
            shared = self.shared_expert(h)
            if self.config.shared_expert_gate:
                shared = torch.sigmoid(self.shared_expert_gate(h)) * shared
            out = out + shared
        return out.view_as(x)


class Block(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + moe(norm(x))."""

    def __init__(self, config: MoEConfig, backend: str) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.n_embd, config.norm_eps)
        self.self_attn = MoEAttention(config, backend)
        self.post_attention_layernorm = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = MoELayer(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class MoE(nn.Module):
    """Mixture-of-Experts decoder with a concrete attention backend (see ``attention.resolve_backend``)."""

    def __init__(self, config: MoEConfig, backend: Literal["flash_attn", "sdpa", "eager"] | str = "sdpa") -> None:
        super().__init__()
        self.config = config
        self.backend = backend
        self.embed_tokens = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config, backend) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.n_embd, config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
            self.register_load_state_dict_pre_hook(MoE._restore_tied_head)

    def anatomy(self) -> ModelAnatomy:
        """Which module is which (``pytest_flashckpt.models.anatomy``)."""
        return moe_anatomy(self.config)

    # the decoder around the blocks is Llama's: the same embedding, rotary tables, final norm, head and loss, and
    # the same tied-head hook for strict loading (only the blocks' MLP differs)
    _restore_tied_head = staticmethod(Llama._restore_tied_head)
    forward = Llama.forward
