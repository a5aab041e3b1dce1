"""Model cards (``models/<name>.yaml``): the shape of a GPT, read and validated without torch.

``GPTConfig`` and ``load_card`` live in the configuration layer so that preflight (``config.preflight``) can check
a suite against its cards before anything is built; ``pytest_flashckpt.models`` builds the module from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_flashckpt.config.data import resolve
from pytest_flashckpt.config.typed import build, load_yaml
from pytest_flashckpt.files import shown_path


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a GPT; a model card (``models/<name>.yaml``) is one of these."""

    name: str = "custom"
    description: str = ""
    vocab_size: int = 2048  # tokens; small for tiny so the logits do not dominate memory
    block_size: int = 2048  # longest sequence (learned position table)
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # attention heads per block
    n_embd: int = 256  # width; head size is n_embd / n_head
    dropout: float = 0.0  # residual, attention and embedding dropout
    bias: bool = True  # biases in Linear and LayerNorm, as GPT-2
    allocate_on_cpu: bool = True  # false for cards too big to allocate on a CPU (built on the meta device)

    def __post_init__(self) -> None:
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


def load_card(name_or_path: str | Path, **overrides) -> GPTConfig:
    """Read a model card by shipped name (``tiny``) or path; ``overrides`` replace card fields (validated)."""
    path = resolve("models", str(name_or_path))
    data = load_yaml(path) or {}
    if isinstance(data, dict):
        data = {**data, **overrides}
    return build(GPTConfig, data, where=shown_path(path))
