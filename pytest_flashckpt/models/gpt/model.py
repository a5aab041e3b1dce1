"""A readable GPT: token + position embedding, pre-LN blocks (causal self-attention, MLP), tied LM head.

Parameter names are stable and used by the checkpoint strategies: ``wte``, ``wpe``, ``blocks.<i>.*``, ``ln_f``
(the head shares ``wte.weight``).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from pytest_flashckpt.config.cards.gpt import GPTConfig
from pytest_flashckpt.models.anatomy import BlockAnatomy, ModelAnatomy
from pytest_flashckpt.models.attention import causal_attention

__all__ = ["GPT", "GPTConfig", "GPT_ANATOMY"]

GPT_ANATOMY = ModelAnatomy(
    family="gpt",
    blocks="blocks",
    block=BlockAnatomy(
        projections={"qkv": "attn.c_attn", "o": "attn.c_proj", "up": "mlp.c_fc", "down": "mlp.c_proj"},
        attention="attn",
        norms=("ln_1", "ln_2"),
    ),
    embeddings=("wte", "wpe"),
    head="lm_head",
    final_norm="ln_f",
    tied=(("lm_head.weight", "wte.weight"),),
)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, backend: str) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.backend = backend
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = causal_attention(q, k, v, self.backend, self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig, backend: str) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, backend)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT with a concrete attention backend (``sdpa``, ``eager`` or ``flash_attn``; see attention.resolve_backend)."""

    def __init__(self, config: GPTConfig, backend: Literal["flash_attn", "sdpa", "eager"] = "sdpa") -> None:
        super().__init__()
        self.config = config
        self.backend = backend
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, backend) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        self.register_load_state_dict_pre_hook(GPT._restore_tied_head)
        self.apply(self._init_weights)
        for name, param in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2: scale residual projections by depth
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def anatomy(self) -> ModelAnatomy:
        """Which module is which (``pytest_flashckpt.models.anatomy``)."""
        return GPT_ANATOMY

    @staticmethod
    def _restore_tied_head(module: "GPT", state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs) -> None:
        """Accept a state dict that stores the tied embedding once (``wte.weight``, no ``lm_head.weight``).

        That is how tied weights are saved for plain tools (``flashckpt export``, transformers' safetensors files):
        safetensors refuses two names for one storage, so the alias is dropped on disk. Because the head *is* the
        embedding, the missing alias is restored from it here, and ``load_state_dict(sd, strict=True)`` still checks
        every other key. A state dict with both keys loads as before."""
        head, embedding = f"{prefix}lm_head.weight", f"{prefix}wte.weight"
        if module.lm_head.weight is module.wte.weight and head not in state_dict and embedding in state_dict:
            state_dict[head] = state_dict[embedding]

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, vocab) without targets; the mean cross-entropy loss with them. ``positions`` (T,): the
        tokens' places in the sequence where they are not 0 .. T - 1 (a context-parallel rank's share)."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size} of {self.config.name}")
        pos = torch.arange(T, device=idx.device) if positions is None else positions
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
