"""The model families: every ``models/<family>/`` folder with a ``family.py`` registers one ``Family`` (as
torchtitan's model folders call ``register_train_spec``); ``families()`` finds them with ``pkgutil``, so a new family
is its folder and its card schema (``config/cards/<family>.py``), with no edit to a list here.

A family says how a card of its schema becomes a module (built with a concrete attention backend), which module is
which without building one (``anatomy``: the blocks, projections by role, norms, embeddings, head, tied weights),
and which of the project's closed forms know its blocks: the matmul FLOP formula (``flop_shape``, read by
``activation.expected_flops.expected_matmul_flops``) and the analytic activation bytes (``analytic_bytes``: the formulas of
``activation.analytic``, GPT blocks only). A family without one shows "—" where a GPT shows the formula's number: a
GPT formula is never applied to another family's block.

It also registers the anatomy discoverers of the model families built outside the project (``transformers``
models), so ``from pytest_flashckpt.activation import apply_ac`` is all a user imports: this module is imported
with the ``pytest_flashckpt.models`` package, which every user of ``models.anatomy`` imports first.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable

import torch.nn as nn

from pytest_flashckpt.config.model_card import card_schemas
from pytest_flashckpt.models.anatomy import ModelAnatomy, register_discoverer
from pytest_flashckpt.models.step_flops import BlockFlopShape

FAMILY_MODULE = "family"  # the module of a family folder that registers it


@dataclass(frozen=True)
class Family:
    """A model family. ``card``: its card schema (``config/cards/<name>.py``); ``build(card, backend)`` -> the module;
    ``anatomy(card)`` -> its ``ModelAnatomy``; ``flop_shape(card)`` -> its block for the FLOP closed form, or None;
    ``analytic_bytes``: ``activation.analytic`` models its blocks' kept bytes."""

    name: str
    card: type
    build: Callable[..., nn.Module]
    anatomy: Callable[..., ModelAnatomy]
    flop_shape: Callable[..., BlockFlopShape] | None = None
    analytic_bytes: bool = False


_FAMILIES: dict[str, Family] = {}
_DISCOVERED: list[str] = []  # the packages whose folders were searched


def register_family(family: Family) -> Family:
    """Register a family (called by its folder's ``family.py``); its card schema must be the one registered for its
    name in ``config.model_card``."""
    schema = card_schemas().get(family.name)
    if schema is not family.card:
        raise ValueError(f"model family {family.name!r}: its card schema {family.card.__qualname__} is not the one "
                         f"config.model_card registered for {family.name!r} ({getattr(schema, '__qualname__', None)}); "
                         f"put it in config/cards/{family.name}.py as CARD")
    if _FAMILIES.get(family.name, family) is not family:
        raise ValueError(f"model family {family.name!r} is registered already")
    _FAMILIES[family.name] = family
    return family


def discover_families(package: str, path) -> None:
    """Import ``<package>.<folder>.family`` for every folder of ``package`` (at ``path``) that has one."""
    _DISCOVERED.append(package)
    for info in pkgutil.iter_modules(path):
        folder = f"{info.module_finder.path}/{info.name}"  # listed, not imported: hf/ would import transformers
        if info.ispkg and any(module.name == FAMILY_MODULE for module in pkgutil.iter_modules([folder])):
            importlib.import_module(f"{package}.{info.name}.{FAMILY_MODULE}")


def families() -> dict[str, Family]:
    """Every registered family by name (the project's folders found on first use)."""
    models = importlib.import_module("pytest_flashckpt.models")
    if models.__name__ not in _DISCOVERED:
        discover_families(models.__name__, models.__path__)
    return dict(_FAMILIES)


def family_of(card) -> Family:
    """The family of a card (``card.family``)."""
    known = families()
    try:
        return known[card.family]
    except KeyError:
        raise ValueError(f"model card {card.name!r}: unknown family {card.family!r}; valid: {', '.join(known)}") from None


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
