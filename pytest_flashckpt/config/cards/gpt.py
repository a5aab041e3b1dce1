"""The GPT family's card schema (``family: gpt``, or no ``family`` key): a GPT-2 / GPT-3 shape.

One module per family in this package, named as the family; ``config.model_card`` discovers them (``CARD``). The
model itself is ``models/gpt/``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_flashckpt.config.card_names import DecoderCardNames


@dataclass(frozen=True)
class GPTConfig(DecoderCardNames):
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

    # the card protocol's other neutral names: config.card_names.DecoderCardNames
    @property
    def mlp_width(self) -> int:
        """The MLP's hidden width: 4 x the width, as GPT-2."""
        return 4 * self.n_embd

    def num_params(self) -> int:
        """Parameter count (tied head counted once), computed without building the model."""
        d, b = self.n_embd, int(self.bias)
        layer_norms = 2 * (d + d * b)
        attention = (3 * d * d + 3 * d * b) + (d * d + d * b)
        mlp = (4 * d * d + 4 * d * b) + (4 * d * d + d * b)
        final_ln = d + d * b
        per_block = layer_norms + attention + mlp
        return self.vocab_size * d + self.block_size * d + self.n_layer * per_block + final_ln


CARD = GPTConfig
