"""The blocks an activation strategy acts on, and the anatomy that names their modules.

A model of one of our families (or one a registered discoverer recognises, e.g. Hugging Face GPT-2, Llama,
Qwen2) has an anatomy (``models.anatomy``): its blocks are the anatomy's, each checked against it
(``check_block``: a ValueError naming the block and the modules that do not match). Any other ``nn.Module``
passes its blocks explicitly: an ``nn.ModuleList``, an ``nn.ModuleDict`` (torchtitan's ``layers``), a list of
modules, or a dotted path to a container.
"""

from __future__ import annotations

from typing import Iterable

import torch.nn as nn

from pytest_flashckpt.models.anatomy import ModelAnatomy, block_names, check_block, container_blocks, get_anatomy, get_blocks

__all__ = ["block_names", "resolve_blocks"]


def resolve_blocks(
    model: nn.Module, blocks: nn.ModuleList | nn.ModuleDict | Iterable[nn.Module] | str | None = None
) -> tuple[list[nn.Module], ModelAnatomy | None]:
    """The blocks a strategy wraps and the anatomy that names their modules (None when ``blocks`` is given for a
    model without one). ``blocks``: None (the anatomy's, each checked with ``check_block``), a dotted submodule
    path (``"model.layers"``, ``"layers"``) or the block container / modules themselves."""
    anatomy: ModelAnatomy | None
    try:
        anatomy = get_anatomy(model)
    except ValueError:
        if blocks is None:
            raise
        anatomy = None
    if blocks is None:
        found = list(get_blocks(model, anatomy))
    else:
        found = _given_blocks(model, blocks)
    if anatomy is not None:
        for name, block in zip(block_names(model, found), found):
            check_block(anatomy, block, where=name)
    return found, anatomy


def _given_blocks(model: nn.Module, blocks) -> list[nn.Module]:
    where = f"apply_ac: blocks={blocks!r}" if isinstance(blocks, str) else "apply_ac: blocks="
    if isinstance(blocks, str):
        try:
            blocks = model.get_submodule(blocks)
        except AttributeError:
            raise ValueError(f"{where}: a {type(model).__name__} has no submodule {blocks!r}; name the container of its "
                             "decoder blocks (a dotted path such as 'model.layers')") from None
    found = container_blocks(blocks if isinstance(blocks, (nn.Module, list, tuple)) else list(blocks))
    if not found:
        raise ValueError(
            f"{where} must be a non-empty nn.ModuleList, nn.ModuleDict or list of the model's block modules (or a dotted "
            f"path to one), got {'an empty ' if found == [] else ''}{type(blocks).__name__}"
        )
    return found
