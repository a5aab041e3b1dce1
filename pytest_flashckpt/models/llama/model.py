"""A readable Llama-style decoder: RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP, no biases.

Module names follow the Hugging Face Llama's inside a block (``self_attn.q_proj`` ... ``mlp.down_proj``,
``input_layernorm``, ``post_attention_layernorm``) so a reader who knows that model finds its way; the blocks are
``blocks.<i>`` as in the project's GPT, the embedding ``embed_tokens``, the final norm ``norm``, the head
``lm_head`` (tied to ``embed_tokens`` when the card says ``tie_word_embeddings``). ``anatomy()`` states all of it.

The rotary cosines and sines are computed once per forward, outside the blocks (float32 angles, then the model
dtype), and passed to every block: a block's forward is ``block(x, cos, sin)``. The card's ``norm`` picks the
RMSNorm (``make_norm``): ``plain`` is written out in plain ops (float32 statistics, as Llama's reference code and
Hugging Face's ``LlamaRMSNorm``); ``fused`` is torch's ``nn.RMSNorm`` (``F.rms_norm``, as torchtitan), one
``_fused_rms_norm`` kernel on CUDA and its decomposition on a CPU. Either way the ``meta`` simulation runs the ops
a CPU runs (the simulator stands in the CUDA kernel for a ``cuda`` target: ``simulate.step_impl``).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from pytest_flashckpt.config.cards.llama import LlamaConfig
from pytest_flashckpt.models.anatomy import BlockAnatomy, ModelAnatomy
from pytest_flashckpt.models.attention import causal_attention

__all__ = ["Llama", "LlamaConfig", "llama_anatomy"]

LLAMA_BLOCK = BlockAnatomy(
    projections={
        "q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
        "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj",
    },
    attention="self_attn",
    norms=("input_layernorm", "post_attention_layernorm"),
)


def llama_anatomy(config: LlamaConfig) -> ModelAnatomy:
    """The anatomy of a ``Llama`` built from ``config`` (the tie depends on the card)."""
    tied = (("lm_head.weight", "embed_tokens.weight"),) if config.tie_word_embeddings else ()
    return ModelAnatomy("llama", "blocks", LLAMA_BLOCK, ("embed_tokens",), "lm_head", "norm", tied)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, the statistics in float32: Hugging Face's ``LlamaRMSNorm`` op for op.
    It keeps a float32 copy of its input (and the normalised output in the model dtype) for the backward pass."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def make_norm(config: LlamaConfig) -> nn.Module:
    """The card's RMSNorm: ``plain`` (``RMSNorm``) or ``fused`` (``nn.RMSNorm``; the same ``weight`` parameter)."""
    if config.norm == "fused":
        return nn.RMSNorm(config.n_embd, eps=config.norm_eps)
    return RMSNorm(config.n_embd, config.norm_eps)


def rotary_tables(seq_len: int, head_dim: int, theta: float, device, dtype,
                  positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, (seq_len, head_dim), for rotating pairs (i, i + head_dim/2) by position * theta^(-2i/head_dim).
    The positions are 0 .. seq_len - 1, or ``positions`` (seq_len,) where given (a context-parallel rank's tokens
    come from two places in the sequence: ``distributed.context_parallel``)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    if positions is None:
        positions = torch.arange(seq_len, device=device, dtype=torch.float32)
    angles = torch.outer(positions.to(torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.size(-1) // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig, backend: str) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        self.backend = backend
        self.q_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.k_proj = nn.Linear(config.n_embd, config.kv_dim, bias=False)
        self.v_proj = nn.Linear(config.n_embd, config.kv_dim, bias=False)
        self.o_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # head counts and width read off the projections: under tensor parallel a rank holds n_head / tp heads
        q = self.q_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        k = self.k_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, n_kv, T, hs)
        v = self.v_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        y = causal_attention(q, k, v, self.backend, 0.0)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class SwiGLU(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: LlamaConfig, backend: str) -> None:
        super().__init__()
        self.input_layernorm = make_norm(config)
        self.self_attn = Attention(config, backend)
        self.post_attention_layernorm = make_norm(config)
        self.mlp = SwiGLU(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """Llama-style decoder with a concrete attention backend (see ``attention.resolve_backend``)."""

    def __init__(self, config: LlamaConfig, backend: Literal["flash_attn", "sdpa", "eager"] | str = "sdpa") -> None:
        super().__init__()
        self.config = config
        self.backend = backend
        self.embed_tokens = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config, backend) for _ in range(config.n_layer))
        self.norm = make_norm(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
            self.register_load_state_dict_pre_hook(Llama._restore_tied_head)

    def anatomy(self) -> ModelAnatomy:
        """Which module is which (``pytest_flashckpt.models.anatomy``)."""
        return llama_anatomy(self.config)

    @staticmethod
    def _restore_tied_head(module: "Llama", state_dict, prefix, *_args) -> None:
        """A state dict that stores the tied embedding once (no ``lm_head.weight``, as safetensors files and
        ``flashckpt export`` write it) gets the alias back from the embedding, so strict loading passes."""
        head, embedding = f"{prefix}lm_head.weight", f"{prefix}embed_tokens.weight"
        if head not in state_dict and embedding in state_dict:
            state_dict[head] = state_dict[embedding]

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, vocab) without targets; the mean cross-entropy loss with them. ``positions`` (T,): the
        tokens' places in the sequence where they are not 0 .. T - 1 (a context-parallel rank's share)."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size} of {self.config.name}")
        x = self.embed_tokens(idx)
        cos, sin = rotary_tables(T, self.config.head_dim, self.config.rope_theta, idx.device, x.dtype, positions)
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
