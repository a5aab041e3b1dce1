"""The model families: one entry per ``models/<family>/`` folder, saying how a card of that family becomes a module.

A family gives the module class (built from its card with a concrete attention backend; the module states its
own anatomy, ``models.anatomy``) and says which of the project's closed forms know its blocks: the analytic
activation model (``activation.analytic``, GPT only) and the matmul FLOP formula. A family without one shows "—"
where a GPT would show the formula's number: a GPT formula is never applied to another family's block.

It also registers the anatomy discoverers of the model families built outside the project (``transformers``
models), so ``from pytest_flashckpt.activation import apply_ac`` is all a user imports: this module is imported
with the ``pytest_flashckpt.models`` package, which every user of ``models.anatomy`` imports first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch.nn as nn

from pytest_flashckpt.config.model_card import CARD_FAMILIES
from pytest_flashckpt.models.anatomy import ModelAnatomy, register_discoverer
from pytest_flashckpt.models.moe.family import build_moe, moe_matmul_flops


@dataclass(frozen=True)
class Family:
    """``build(card, backend)`` -> the module; ``analytic``: ``activation.analytic`` models its blocks;
    ``matmul_flops``: the closed-form FLOPs of one step (``(card, batch, seq, strategy) -> int``) or None."""

    name: str
    build: Callable[..., nn.Module]
    analytic: bool = False
    matmul_flops: Callable[..., int] | None = None


def _gpt(card, backend: str) -> nn.Module:
    from pytest_flashckpt.models.gpt import GPT

    return GPT(card, backend=backend)


def _llama(card, backend: str) -> nn.Module:
    from pytest_flashckpt.models.llama import Llama

    return Llama(card, backend=backend)


def _llama_flops(card, batch_size: int, seq_len: int, strategy: str = "none", k: int = 2) -> int:
    from pytest_flashckpt.models.llama.flops import expected_matmul_flops

    return expected_matmul_flops(card, batch_size, seq_len, strategy, k)


FAMILIES: dict[str, Family] = {
    "gpt": Family("gpt", _gpt, analytic=True),  # FLOPs: activation.flops.expected_matmul_flops (GPT's closed form)
    "llama": Family("llama", _llama, matmul_flops=_llama_flops),
    "moe": Family("moe", build_moe, matmul_flops=moe_matmul_flops),
}
assert set(FAMILIES) == set(CARD_FAMILIES), "every card family needs a model family"


def family_of(card) -> Family:
    """The family of a card (``card.family``)."""
    try:
        return FAMILIES[card.family]
    except KeyError:
        raise ValueError(f"model card {card.name!r}: unknown family {card.family!r}; valid: {', '.join(FAMILIES)}") from None


def is_transformers_model(model: nn.Module) -> bool:
    """A module whose class (or a base class) comes from transformers, told by the class's module name alone."""
    return any(cls.__module__.split(".")[0] == "transformers" for cls in type(model).__mro__)


def discover_transformers_anatomy(model: nn.Module) -> ModelAnatomy | None:
    """The Hugging Face discoverer, imported the first time a transformers model is met, so importing the package
    costs no transformers import (``models.hf.anatomy`` imports none either; it reads module names)."""
    if not is_transformers_model(model):
        return None
    from pytest_flashckpt.models.hf.anatomy import discover_anatomy

    return discover_anatomy(model)


register_discoverer(discover_transformers_anatomy)
