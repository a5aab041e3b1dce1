"""Model weights as a standard state dict that plain tools open: ``flashckpt export CKPT OUT.safetensors``.

A checkpoint holds the whole training state under prefixed keys (``model/...``, ``optimizer/state/<i>/...``) with
the tied LM head recorded as an alias in ``meta.json``. An export is what ``torch.load(weights_only=True)`` or
``safetensors.torch.load_file`` alone can feed to ``model.load_state_dict(sd, strict=True)``: the model's own keys,
every one of them. A tied weight's alias (``lm_head.weight`` of a head tied to the embedding) is written too, since
a plain ``load_state_dict`` (a transformers ``GPT2LMHeadModel``'s included: only ``from_pretrained`` re-ties) names a
missing alias as a missing key. safetensors refuses two names for one storage, so in a ``.safetensors`` export the
alias is its own copy of the owner's bytes (the file grows by that tensor); loading copies both into the one shared
parameter, so the tie survives. A ``.pt`` export keeps the alias as the same tensor (torch files share storages).
An untied model's export is exactly its weights, as before. The aliases are listed in the metadata
(``flashckpt.tied``).

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
    tied: dict[str, str]  # tied alias -> the key that owns its tensor (both written)
    metadata: dict[str, str]


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint folder as given, or the one a checkpoint root's ``latest`` names."""
    path = Path(path)
    if (path / MANIFEST).is_file() or not (path / LATEST).is_file():
        return path
    name = CheckpointStore(path).latest_name()  # refuses a latest that leads out of the root
    return path / str(name)


def model_state_dict(loaded: LoadedCheckpoint) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The model's weights under its own keys, each tensor once, and the tied aliases (alias -> owner) the
    checkpoint stores only once."""
    weights = {k.removeprefix("model/"): t for k, t in loaded.tensors.items() if k.startswith("model/")}
    tied = dict(loaded.meta["tree"].get("model_aliases", {}))
    return weights, tied


def with_aliases(weights: dict[str, torch.Tensor], tied: dict[str, str], copy: bool) -> dict[str, torch.Tensor]:
    """``weights`` plus every tied alias: the owner's tensor itself, or (``copy``, for safetensors, which refuses
    shared storages) its own copy. A tie whose owner the checkpoint lacks is a CheckpointError, not a file that
    would fail to load."""
    out = {k: t.contiguous() for k, t in weights.items()}
    for alias, owner in sorted(tied.items()):
        if owner not in out:
            raise CheckpointError(f"checkpoint ties {alias!r} to {owner!r}, which it does not hold; it cannot be exported")
        if alias not in out:
            out[alias] = out[owner].clone() if copy else out[owner]
    return out


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
    payload = with_aliases(weights, tied, copy=out.suffix == ".safetensors")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        if out.suffix == ".safetensors":
            save_file(payload, str(tmp), metadata=metadata)
        else:
            torch.save(payload, tmp)
        fsync_path(tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return Exported(out, folder, sorted(payload), tied, metadata)
