"""Which parameters a selective save keeps (``select_params``) and how a save splits tensors into files."""

from __future__ import annotations

import fnmatch
import re

import torch.nn as nn

from pytest_flashckpt.checkpoint.state import CapturedState

EMBEDDINGS = ("wte.", "wpe.", "lm_head.")
_BLOCK = re.compile(r"^blocks\.(\d+)\.")


def select_names(model: nn.Module, select_params: bool | str | list[str] | tuple[str, ...]) -> set[str]:
    """Parameter names kept: true = non-embedding (the article's meaning), "trainable" = requires_grad,
    a list = glob patterns. An empty selection is an error naming what exists."""
    names = [n for n, _ in model.named_parameters()]
    if select_params is True:
        chosen = {n for n in names if not n.startswith(EMBEDDINGS)}
    elif select_params == "trainable":
        chosen = {n for n, p in model.named_parameters() if p.requires_grad}
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


def block_of(param_name: str | None) -> int | None:
    match = _BLOCK.match(param_name or "")
    return int(match.group(1)) if match else None


def layer_files(state: CapturedState, folder: str, suffix: str) -> dict[str, list[str]]:
    """One file per transformer block (its weights and their optimizer state) plus ``rest`` for everything else."""
    files: dict[str, list[str]] = {}
    for key, owner in state.owners.items():
        block = block_of(owner)
        rel = f"{folder}/block_{block:03d}{suffix}" if block is not None else f"{folder}/rest{suffix}"
        files.setdefault(rel, []).append(key)
    return files
