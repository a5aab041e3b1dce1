"""The Llama family's card schema (``family: llama``); the model is ``models/llama/``."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_flashckpt.config.card_names import DecoderCardNames
from pytest_flashckpt.config.step_impl import NORMS


@dataclass(frozen=True)
class LlamaConfig(DecoderCardNames):
    """Shape of a Llama-style decoder (``family: llama``): RMSNorm, SwiGLU MLP, rotary positions, grouped-query
    attention (``n_kv_head`` key/value heads shared by ``n_head / n_kv_head`` query heads each), no biases, a head
    tied to the embedding only where the model ties it (Llama-3.2-1B does, Llama-3-8B/70B do not)."""

    name: str = "custom"
    description: str = ""
    family: str = "llama"
    vocab_size: int = 2048
    block_size: int = 2048  # longest sequence (rotary positions have no table: no parameters depend on it)
    n_layer: int = 4
    n_head: int = 4  # query heads; head size is n_embd / n_head
    n_kv_head: int = 2  # key/value heads (GQA); n_head for plain multi-head attention, 1 for multi-query
    n_embd: int = 256
    intermediate_size: int = 688  # the SwiGLU MLP's hidden width (gate and up projections)
    rope_theta: float = 500000.0  # rotary base (Llama 3)
    norm_eps: float = 1e-5  # RMSNorm epsilon
    tie_word_embeddings: bool = False  # the head shares the embedding's weight
    norm: str = "plain"  # RMSNorm: plain (Hugging Face's fp32 ops) or fused (torch's nn.RMSNorm, as torchtitan); config.step_impl
    dropout: float = 0.0  # Llama models train without dropout; kept so a scenario's override is checked
    allocate_on_cpu: bool = True  # false for cards too big to allocate on a CPU (built on the meta device)

    def __post_init__(self) -> None:
        if self.family != "llama":
            raise ValueError(f"family must be 'llama' for a LlamaConfig, got {self.family!r}")
        for key in ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd", "intermediate_size"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.head_dim % 2:
            raise ValueError(f"head size n_embd / n_head = {self.head_dim} must be even for rotary positions")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})")
        if self.dropout != 0.0:
            raise ValueError(f"dropout must be 0 for the llama family (its blocks have no dropout), got {self.dropout}")
        if self.rope_theta <= 0 or self.norm_eps <= 0:
            raise ValueError("rope_theta and norm_eps must be positive")
        if self.norm not in NORMS:
            raise ValueError(f"norm: unknown RMSNorm implementation {self.norm!r}; valid: {', '.join(NORMS)}")

    # the card protocol's other neutral names: config.card_names.DecoderCardNames
    @property
    def mlp_width(self) -> int:
        """The SwiGLU MLP's hidden width (gate and up projections)."""
        return self.intermediate_size

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection: n_kv_head * head_dim."""
        return self.n_kv_head * self.head_dim

    def num_params(self) -> int:
        """Parameter count (a tied head counted once), computed without building the model."""
        d, kv, inner = self.n_embd, self.kv_dim, self.intermediate_size
        attention = 2 * d * d + 2 * d * kv  # q, o; k, v
        mlp = 3 * d * inner  # gate, up, down
        per_block = attention + mlp + 2 * d  # two RMSNorm weights
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.vocab_size * d + self.n_layer * per_block + d + head


CARD = LlamaConfig
