"""Which parameters a selective save keeps (``select_params``) and how a save splits tensors into files, both read
from the model's anatomy (``models.anatomy``), never from the project's own parameter names.

* Embeddings are the parameters of the anatomy's ``embeddings`` modules, plus every name tied to one of them (a tied
  head *is* the embedding, one storage). An untied head is a trained projection like any other and is selected:
  leaving it to the base would resume it from the base's step, silently not bitwise. A model without an anatomy
  has its ``nn.Embedding`` modules' parameters as embeddings (and whatever shares their storage).
* Blocks are the children of the anatomy's ``blocks`` list (``blocks``, ``transformer.h``, ``model.layers``): one
  file each, and ``rest`` for everything else. A layer-wise save of a model without an anatomy is an error saying
  how to give one.
"""

from __future__ import annotations

import fnmatch
import re

import torch.nn as nn

from pytest_flashckpt.checkpoint.state import CapturedState
from pytest_flashckpt.models.anatomy import ModelAnatomy, get_anatomy


def anatomy_or_none(model: nn.Module) -> ModelAnatomy | None:
    """The model's anatomy, or None when neither the model nor a discoverer states one."""
    try:
        return get_anatomy(model)
    except ValueError:
        return None


def embedding_names(model: nn.Module) -> set[str]:
    """Parameter names (tied aliases included) that belong to an input embedding."""
    anatomy = anatomy_or_none(model)
    params = list(model.named_parameters(remove_duplicate=False))
    if anatomy is not None:
        prefixes = tuple(f"{name}." for name in anatomy.embeddings)
        owned = {n for n, _ in params if n.startswith(prefixes)}
        for alias, owner in anatomy.tied:
            if owner in owned:
                owned.add(alias)
    else:
        embeds = [f"{n}." for n, m in model.named_modules() if isinstance(m, nn.Embedding)]
        owned = {n for n, _ in params if n.startswith(tuple(embeds))} if embeds else set()
    storages = {p.untyped_storage().data_ptr() for n, p in params if n in owned}
    return owned | {n for n, p in params if p.untyped_storage().data_ptr() in storages}


def select_names(model: nn.Module, select_params: bool | str | list[str] | tuple[str, ...]) -> set[str]:
    """Parameter names kept (tied aliases included): true = non-embedding (the article's meaning, by anatomy),
    "trainable" = requires_grad, a list = glob patterns. An empty selection is an error naming what exists."""
    params = list(model.named_parameters(remove_duplicate=False))
    names = [n for n, _ in params]
    if select_params is True:
        embeddings = embedding_names(model)
        chosen = {n for n in names if n not in embeddings}
    elif select_params == "trainable":
        chosen = {n for n, p in params if p.requires_grad}
    elif isinstance(select_params, (list, tuple)) and all(isinstance(p, str) for p in select_params):
        chosen = {n for n in names if any(fnmatch.fnmatchcase(n, pat) for pat in select_params)}
    else:
        raise ValueError(f"select_params must be true, 'trainable' or a list of glob patterns, got {select_params!r}")
    if not chosen:
        raise ValueError(f"select_params {select_params!r} selects no parameter; names look like {', '.join(names[:4])}, ...")
    return chosen


def selective_keys(state: CapturedState, chosen: set[str]) -> list[str]:
    """Tensor keys of the chosen parameters (weights and their optimizer state) plus the global ones (RNG)."""
    return [k for k, owner in state.owners.items() if owner is None or owner in chosen]


def blocks_prefix(model: nn.Module) -> str:
    """``<blocks path>.`` of the model's anatomy; a ValueError saying how to give an anatomy when it has none."""
    anatomy = anatomy_or_none(model)
    if anatomy is None:
        try:
            get_anatomy(model)
        except ValueError as exc:
            raise ValueError(f"a layer-wise save writes one file per block, but its blocks are unknown: {exc}") from None
    return f"{anatomy.blocks}."  # type: ignore[union-attr]


def block_of(param_name: str | None, prefix: str = "blocks.") -> int | None:
    """The block index of a parameter named ``<prefix><i>.…``, or None."""
    match = re.match(rf"^{re.escape(prefix)}(\d+)\.", param_name or "")
    return int(match.group(1)) if match else None


def layer_files(state: CapturedState, folder: str, suffix: str, prefix: str = "blocks.") -> dict[str, list[str]]:
    """One file per block under ``prefix`` (its weights and their optimizer state) plus ``rest`` for everything else."""
    files: dict[str, list[str]] = {}
    for key, owner in state.owners.items():
        block = block_of(owner, prefix)
        rel = f"{folder}/block_{block:03d}{suffix}" if block is not None else f"{folder}/rest{suffix}"
        files.setdefault(rel, []).append(key)
    return files
