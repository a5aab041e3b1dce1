"""Model cards (``models/<name>.yaml``): the shape of a model of one family, read and validated without torch.

A card names its family (``family: llama``; without the key it is ``gpt``, so the GPT cards written before
families existed keep working) and is validated by that family's dataclass: ``GPTConfig`` or ``LlamaConfig``. A key
of the other family is an error saying which family has it. The cards live in the configuration layer so that
preflight (``config.preflight``) can check a suite against its cards before anything is built;
``pytest_flashckpt.models`` builds the module from them (``models.families``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Union

from pytest_flashckpt.config.errors import ConfigError

from pytest_flashckpt.config.data import resolve
from pytest_flashckpt.config.moe_card import MoEConfig
from pytest_flashckpt.config.typed import build, load_yaml
from pytest_flashckpt.core.files import shown_path


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a GPT; a model card (``models/<name>.yaml``) is one of these."""

    name: str = "custom"
    description: str = ""
    family: str = "gpt"  # the model family (models/<family>/); see load_card
    vocab_size: int = 2048  # tokens; small for tiny so the logits do not dominate memory
    block_size: int = 2048  # longest sequence (learned position table)
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # attention heads per block
    n_embd: int = 256  # width; head size is n_embd / n_head
    dropout: float = 0.0  # residual, attention and embedding dropout
    bias: bool = True  # biases in Linear and LayerNorm, as GPT-2
    allocate_on_cpu: bool = True  # false for cards too big to allocate on a CPU (built on the meta device)

    def __post_init__(self) -> None:
        if self.family != "gpt":
            raise ValueError(f"family must be 'gpt' for a GPTConfig, got {self.family!r}")
        for key in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def num_params(self) -> int:
        """Parameter count (tied head counted once), computed without building the model."""
        d, b = self.n_embd, int(self.bias)
        layer_norms = 2 * (d + d * b)
        attention = (3 * d * d + 3 * d * b) + (d * d + d * b)
        mlp = (4 * d * d + 4 * d * b) + (4 * d * d + d * b)
        final_ln = d + d * b
        per_block = layer_norms + attention + mlp
        return self.vocab_size * d + self.block_size * d + self.n_layer * per_block + final_ln


@dataclass(frozen=True)
class LlamaConfig:
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

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

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


ModelCard = Union[GPTConfig, LlamaConfig]
CARD_FAMILIES: dict[str, type] = {"gpt": GPTConfig, "llama": LlamaConfig, "moe": MoEConfig}


def load_card(name_or_path: str | Path, **overrides) -> ModelCard:
    """Read a model card by shipped name (``tiny``) or path; ``overrides`` replace card fields (validated by the
    card's family: ``family`` absent means ``gpt``)."""
    path = resolve("models", str(name_or_path))
    where = shown_path(path)
    data = load_yaml(path) or {}
    if isinstance(data, dict):
        data = {**data, **overrides}
    family = data.get("family", "gpt") if isinstance(data, dict) else "gpt"
    cls = CARD_FAMILIES.get(family) if isinstance(family, str) else None
    if cls is None:
        raise ConfigError(where, f"family: {family!r} is not a model family", f"valid: {', '.join(CARD_FAMILIES)}")
    try:
        return build(cls, data, where=where)
    except ConfigError as exc:
        other = _family_with_key(exc.problem, family)
        if other is None:
            raise
        raise ConfigError(exc.where, exc.problem, f"{exc.fix}; that key belongs to the {other} family: "
                          f"a {other} card says 'family: {other}'") from None


def _family_with_key(problem: str, family: str) -> str | None:
    """For an "unknown key 'n_kv_head'" problem: the other family whose cards have that key, or None."""
    if not problem.startswith("unknown key "):
        return None
    key = problem.removeprefix("unknown key ").strip("'\"")
    for name, cls in CARD_FAMILIES.items():
        if name != family and key in {f.name for f in fields(cls)}:
            return name
    return None
