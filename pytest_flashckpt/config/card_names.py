"""The card protocol's neutral names (``config.model_card.ModelCard``) for cards that keep GPT-2's field names
(``n_layer``, ``n_embd``, ``block_size``, ``n_head``): the GPT, Llama and MoE card schemas and a Hugging Face config
read as a card (``models.hf.card``). A family with other field names defines the properties itself; code outside a
family reads only the neutral names."""

from __future__ import annotations


class DecoderCardNames:
    """``num_blocks``, ``width``, ``max_seq_len``, ``num_heads`` and ``head_dim`` read from the GPT-2 field names (a
    mixin of frozen dataclasses: no fields of its own). ``mlp_width`` differs per family and stays with each card."""

    n_layer: int
    n_embd: int
    block_size: int
    n_head: int

    @property
    def num_blocks(self) -> int:
        return self.n_layer

    @property
    def width(self) -> int:
        return self.n_embd

    @property
    def max_seq_len(self) -> int:
        return self.block_size

    @property
    def num_heads(self) -> int:
        return self.n_head

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head
