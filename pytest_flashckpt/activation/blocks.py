"""The blocks an activation strategy acts on, and the anatomy that names their modules.

A model of one of our families (or one a registered discoverer recognises, e.g. Hugging Face) has an anatomy
(``models.anatomy``): its blocks are the anatomy's, each checked against it (``check_block``: a ValueError
naming the block and the modules that do not match). Any other ``nn.Module`` passes its blocks explicitly.
"""

from __future__ import annotations

from typing import Iterable

import torch.nn as nn

from pytest_flashckpt.models.anatomy import ModelAnatomy, check_block, get_anatomy, get_blocks


def resolve_blocks(
    model: nn.Module, blocks: nn.ModuleList | Iterable[nn.Module] | str | None = None
) -> tuple[list[nn.Module], ModelAnatomy | None]:
    """The blocks a strategy wraps and the anatomy that names their modules (None when ``blocks`` is given for a
    model without one). ``blocks``: None (the anatomy's, each checked with ``check_block``), a dotted submodule
    path (``"model.layers"``) or the block modules themselves."""
    anatomy: ModelAnatomy | None
    try:
        anatomy = get_anatomy(model)
    except ValueError:
        if blocks is None:
            raise
        anatomy = None
    if blocks is None:
        found = list(get_blocks(model, anatomy))
        names = [f"{anatomy.blocks}.{i}" for i in range(len(found))]
    else:
        if isinstance(blocks, str):
            blocks = model.get_submodule(blocks)
        found = list(blocks)
        if not found or not all(isinstance(b, nn.Module) for b in found):
            raise ValueError("apply_ac: blocks= must name a non-empty ModuleList (or a dotted path to one) of nn.Modules")
        names = block_names(model, found)
    if anatomy is not None:
        for name, block in zip(names, found):
            check_block(anatomy, block, where=name)
    return found, anatomy


def block_names(model: nn.Module, blocks: list[nn.Module]) -> list[str]:
    """Each block's dotted name in the model (``blocks.3``, ``model.layers.3``; ``blocks[i]`` for a block that is
    not a submodule), for errors."""
    by_id = {id(m): name for name, m in model.named_modules()}
    return [by_id.get(id(b), f"blocks[{i}]") for i, b in enumerate(blocks)]
