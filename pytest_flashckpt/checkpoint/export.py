"""Model weights as a standard state dict that plain tools open: ``flashckpt export CKPT OUT.safetensors``.

A checkpoint holds the whole training state under prefixed keys (``model/...``, ``optimizer/state/<i>/...``) with
the tied LM head recorded as an alias in ``meta.json``. An export is what ``torch.load(weights_only=True)`` or
``safetensors.torch.load_file`` alone can feed to ``model.load_state_dict``: the model's own keys, each tensor once.
Tied weights are stored the way transformers stores them in safetensors: the alias (``lm_head.weight``) is dropped,
because safetensors refuses two names for one storage; the GPT restores its tie when loading (see
``GPT._restore_tied_head``), so ``load_state_dict(sd, strict=True)`` passes. The aliases are also listed in the
metadata (``flashckpt.tied``) for other models.

Safetensors metadata: ``format: pt`` (what transformers writes and checks) and ``flashckpt.*`` keys: step, strategy,
the checkpoint folder's name, and the pytest_flashckpt and torch versions that wrote the checkpoint. A ``.pt`` export
is a plain ``{name: tensor}`` dict (torch files carry no metadata).
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from pytest_flashckpt.checkpoint.errors import CheckpointError
from pytest_flashckpt.checkpoint.formats import fsync_path
from pytest_flashckpt.checkpoint.loading import LoadedCheckpoint, read_checkpoint
from pytest_flashckpt.checkpoint.manifest import MANIFEST
from pytest_flashckpt.checkpoint.store import LATEST, CheckpointStore

SUFFIXES = (".safetensors", ".pt")


@dataclass
class Exported:
    path: Path
    source: Path
    keys: list[str]
    tied: dict[str, str]  # dropped alias -> the key that holds its tensor
    metadata: dict[str, str]


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint folder as given, or the one a checkpoint root's ``latest`` names."""
    path = Path(path)
    if (path / MANIFEST).is_file() or not (path / LATEST).is_file():
        return path
    name = CheckpointStore(path).latest_name()  # refuses a latest that leads out of the root
    return path / str(name)


def model_state_dict(loaded: LoadedCheckpoint) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The model's weights under its own keys, each tensor once, and the tied aliases that were dropped."""
    weights = {k.removeprefix("model/"): t for k, t in loaded.tensors.items() if k.startswith("model/")}
    tied = dict(loaded.meta["tree"].get("model_aliases", {}))
    return weights, tied


def export_weights(checkpoint: Path, out: Path) -> Exported:
    """Verify ``checkpoint`` (a folder, or a root whose ``latest`` is used) and write its model weights to ``out``
    (``.safetensors`` or ``.pt``), atomically (a temporary file beside it, fsynced, then renamed)."""
    out = Path(out)
    if out.suffix not in SUFFIXES:
        raise CheckpointError(f"{out}: unknown export format {out.suffix!r}; name the file *.safetensors or *.pt")
    folder = resolve_checkpoint(checkpoint)
    loaded = read_checkpoint(folder)
    weights, tied = model_state_dict(loaded)
    if not weights:
        raise CheckpointError(f"{folder}: holds no model weights (keys under model/) to export")
    versions = loaded.manifest.versions
    metadata = {
        "format": "pt",
        "flashckpt.step": str(loaded.manifest.step),
        "flashckpt.strategy": loaded.manifest.strategy,
        "flashckpt.checkpoint": folder.name,
        "flashckpt.version": versions.get("pytest_flashckpt", "unknown"),
        "flashckpt.torch": versions.get("torch", "unknown"),
        "flashckpt.tied": json.dumps(tied, sort_keys=True),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        if out.suffix == ".safetensors":
            save_file({k: t.contiguous() for k, t in weights.items()}, str(tmp), metadata=metadata)
        else:
            torch.save({k: t.contiguous() for k, t in weights.items()}, tmp)
        fsync_path(tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return Exported(out, folder, sorted(weights), tied, metadata)
