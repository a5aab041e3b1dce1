"""Reading checkpoints back: verified full restores, resume from ``latest`` with fallback, partial loads.

Every load verifies the manifest first (sizes and sha256 of every file), so a corrupt, truncated or partial checkpoint
is an error naming the file before any tensor is used. Selective checkpoints are read on top of the base their
manifest names.

Nothing a checkpoint names is trusted (whoever writes its files can re-hash the manifest): every name -- manifest
entries, the files ``meta.json`` lists, the base, ``latest``, DCP shard files -- must stay inside its folder
(``paths``), every file read must be listed in the manifest, and DCP metadata is read by ``safe_dcp``, which runs
no code from it.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch
import torch.nn as nn

from pytest_flashckpt.checkpoint import dcp_io, formats, safe_dcp
from pytest_flashckpt.checkpoint.errors import (
    CheckpointError,
    CheckpointFallbackWarning,
    CorruptCheckpointError,
    NoCheckpointError,
    SelectiveResumeWarning,
    StrictLoadError,
    caller_stacklevel,
)
from pytest_flashckpt.checkpoint.manifest import MANIFEST, Manifest, verify
from pytest_flashckpt.checkpoint.paths import confined, plain_name
from pytest_flashckpt.checkpoint.payload import META, read_meta
from pytest_flashckpt.checkpoint.roots import check_root
from pytest_flashckpt.checkpoint.selection import blocks_prefix
from pytest_flashckpt.checkpoint.state import restore
from pytest_flashckpt.checkpoint.store import LATEST, CheckpointStore
from pytest_flashckpt.training import Trainer

log = logging.getLogger(__name__)


@dataclass
class LoadedCheckpoint:
    folder: Path
    manifest: Manifest
    meta: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    from_base: set[str] = field(default_factory=set)  # keys taken from the base of a selective checkpoint
    load_s: float = 0.0


@dataclass
class KeyReport:
    """A model-only load: ``missing_keys`` the model has but neither the checkpoint nor its base provides,
    ``unexpected_keys`` the checkpoint holds but the model lacks."""

    loaded: list[str]
    missing_keys: list[str]
    unexpected_keys: list[str]


_FORMATS = ("torch", "safetensors", "dcp")


def checked_meta(folder: Path, manifest: Manifest) -> dict[str, Any]:
    """``meta.json``, which must be listed in (so verified by) the manifest and shaped as this library writes it:
    every tensor names a file inside the folder that the manifest lists, a torch dtype and a shape."""
    if META not in manifest.files:
        raise CorruptCheckpointError(f"{folder / META}: not listed in {folder / MANIFEST}, so never verified; delete the checkpoint or resume from an older one")
    try:
        meta = read_meta(folder)
    except (ValueError, OSError) as exc:
        raise CorruptCheckpointError(f"{folder / META}: unreadable ({type(exc).__name__}); delete the checkpoint or resume from an older one") from None
    tensors = meta.get("tensors") if isinstance(meta, dict) else None
    if not isinstance(tensors, dict) or meta.get("format") not in _FORMATS or not isinstance(meta.get("tree"), dict):
        raise CorruptCheckpointError(f"{folder / META}: malformed (needs format one of {', '.join(_FORMATS)}, tensors, tree); delete the checkpoint or resume from an older one")
    for key, spec in tensors.items():
        ok = (
            isinstance(spec, dict) and isinstance(spec.get("file"), str) and isinstance(spec.get("dtype"), str)
            and isinstance(getattr(torch, spec["dtype"], None), torch.dtype) and isinstance(spec.get("shape"), list)
            and all(type(n) is int and n >= 0 for n in spec["shape"])
        )
        if not ok:
            raise CorruptCheckpointError(f"{folder / META}: tensor {key!r} has a malformed entry {spec!r}; delete the checkpoint or resume from an older one")
    for rel in sorted({v["file"] for v in tensors.values()}):
        confined(folder, rel, f"{META} file")
        listed = f"{rel}/{safe_dcp.METADATA}" if meta["format"] == "dcp" else rel
        if listed not in manifest.files:
            raise CorruptCheckpointError(
                f"{folder}: {META} names {rel!r}, which {MANIFEST} does not list (so it was never verified); "
                "delete the checkpoint or resume from an older one"
            )
    return meta


def _read_files(folder: Path, manifest: Manifest, meta: dict[str, Any], files: Iterable[str]) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    fmt = meta["format"]
    for rel in files:
        if fmt == "dcp":
            spec = {k: v for k, v in meta["tensors"].items() if v["file"] == rel}
            tensors.update(dcp_io.load(folder / rel, spec, listed=manifest.files, prefix=f"{rel}/"))
        else:
            tensors.update(formats.read_tensor_file(folder / rel, fmt))
    return tensors


def read_checkpoint(folder: Path, *, with_base: bool = True) -> LoadedCheckpoint:
    """Verify and read every tensor of a checkpoint (and of its base, for a selective one)."""
    start = time.perf_counter()
    folder = Path(folder)
    manifest = verify(folder)
    meta = checked_meta(folder, manifest)
    files = sorted({v["file"] for v in meta["tensors"].values()})
    tensors = _read_files(folder, manifest, meta, files)
    from_base: set[str] = set()
    if with_base and manifest.base:
        base_folder = plain_name(folder.parent, manifest.base, f"base named in {folder / MANIFEST}")
        if not base_folder.is_dir():
            raise CorruptCheckpointError(f"{folder}: its base checkpoint {base_folder} is gone; a selective checkpoint needs its base")
        base = read_checkpoint(base_folder)
        from_base = set(base.tensors) - set(tensors)
        tensors = {**base.tensors, **tensors}
    return LoadedCheckpoint(folder, manifest, meta, tensors, from_base, time.perf_counter() - start)


def load_into(trainer: Trainer, folder: Path) -> LoadedCheckpoint:
    """Restore the full training state saved in ``folder`` into ``trainer``."""
    start = time.perf_counter()
    loaded = read_checkpoint(folder)
    try:
        restore(trainer, loaded.tensors, loaded.meta["tree"], str(folder))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:  # a tree not as this library writes it
        raise CorruptCheckpointError(f"{folder / META}: its state tree does not describe a training state ({type(exc).__name__}: {str(exc)[:200]}); delete the checkpoint or resume from an older one") from None
    loaded.load_s = time.perf_counter() - start
    return loaded


def resume_latest(trainer: Trainer, root: Path, *, required: bool = False) -> LoadedCheckpoint | None:
    """Restore from what ``root/latest`` names; if it fails verification (or names a folder that is gone), warn
    (``CheckpointFallbackWarning``) and use the newest valid checkpoint.

    No checkpoint yet -- ``root`` does not exist, or holds no committed checkpoint -- returns None, so a first run
    starts from scratch without ceremony; the reason is logged at INFO on this module's logger. A job that must
    resume (a restart after preemption, where a mistyped path would silently retrain from step 0) passes
    ``required=True`` and gets a ``NoCheckpointError`` naming the root instead. Checkpoints that exist but all fail
    verification are always an error (``CheckpointError``), never None; so is a root that cannot be one (a file, a
    URL, one checkpoint folder: ``InvalidRootError``).

    A selective checkpoint whose base supplied trainable parameters warns (``SelectiveResumeWarning``): they are as of
    the base's step. ``CheckpointManager.resume`` comes through here, so both warn alike.
    """
    root = check_root(root, writing=False)
    store = CheckpointStore(root)
    complete = store.complete()
    problems: list[str] = []
    try:
        latest = store.latest_name()
    except CheckpointError as exc:  # a pointer out of the root (or unreadable): never followed
        problems.append(str(exc))
        latest = None
    if latest is None and not complete:
        if problems:
            raise CheckpointError(f"no valid checkpoint in {root}: {'; '.join(problems)}")
        reason = (f"{root} does not exist" if not root.exists() else f"{root} holds no committed checkpoint")
        message = f"no checkpoint yet: {reason}"
        if required:
            raise NoCheckpointError(f"{message}; check the path, or resume with required=False to start from scratch")
        log.info("%s; starting from scratch", message)
        return None
    candidates = [p for p in reversed(complete) if p.name != latest]
    if latest is not None:
        if (root / latest).is_dir():
            candidates.insert(0, root / latest)
        else:
            problems.append(f"{root / LATEST} names {latest!r}, which does not exist in {root} (deleted or moved)")
    for folder in candidates:
        try:
            plain_name(root, folder.name, "checkpoint folder")  # a symlink out of the root is not followed
            loaded = load_into(trainer, folder)
        except CheckpointError as exc:
            problems.append(str(exc))
            continue
        if problems:
            warnings.warn(
                f"resumed from {folder} because newer checkpoints could not be loaded: {'; '.join(problems)}",
                CheckpointFallbackWarning,
                stacklevel=caller_stacklevel(),
            )
        warn_stale_from_base(loaded, trainer.model)
        return loaded
    raise CheckpointError(f"no valid checkpoint in {root}: {'; '.join(problems)}")


def warn_stale_from_base(loaded: LoadedCheckpoint, model: nn.Module) -> None:
    """Trainable parameters a selective checkpoint left to its base are restored as of the base's step: warn
    (``SelectiveResumeWarning``) naming them and the fix. Frozen ones are exact and say nothing."""
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    stale = sorted(k.removeprefix("model/") for k in loaded.from_base if k.startswith("model/") and k.removeprefix("model/") in trainable)
    if stale:
        warnings.warn(
            f"{loaded.folder}: {len(stale)} trainable parameter(s) came from the selective checkpoint's base "
            f"{loaded.manifest.base!r}, not from step {loaded.manifest.step} ({', '.join(stale[:4])}{', ...' if len(stale) > 4 else ''}); "
            "the resume is not bitwise unless they are frozen: select them (select_params) or freeze them",
            SelectiveResumeWarning,
            stacklevel=caller_stacklevel(),
        )


def _model_keys(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {k.removeprefix("model/"): t for k, t in tensors.items() if k.startswith("model/")}
    for alias, target in meta["tree"]["model_aliases"].items():
        if target in out:
            out[alias] = out[target]
    return out


def load_model_tensors(model: nn.Module, folder: Path, *, strict: bool = True, with_base: bool = True) -> KeyReport:
    """Load only model weights (any layout); a selective checkpoint goes on top of its base unless ``with_base``
    is False, in which case it goes on top of what ``model`` holds. Strict: missing or unexpected keys raise."""
    loaded = read_checkpoint(folder, with_base=with_base)
    weights = _model_keys(loaded.meta, loaded.tensors)
    return _apply(model, weights, folder, strict, require_all=with_base)


def load_blocks(model: nn.Module, folder: Path, blocks: Iterable[int]) -> KeyReport:
    """Load the weights of the given transformer blocks from a layer-wise checkpoint (only their files are read)."""
    folder = Path(folder)
    manifest = verify(folder)
    meta = checked_meta(folder, manifest)
    wanted = sorted(set(blocks))
    prefix = blocks_prefix(model)  # the model's anatomy: blocks., transformer.h., model.layers.
    files = {v["file"] for k, v in meta["tensors"].items() if any(k.startswith(f"model/{prefix}{b}.") for b in wanted)}
    if len(files) == 0 or any("block_" not in f for f in files):
        raise CheckpointError(f"{folder} ({manifest.strategy}) has no per-block files for blocks {wanted}; save with layout: layerwise (strategy layerwise, or layer_checkpoint_dir)")
    tensors = _read_files(folder, manifest, meta, sorted(files))
    weights = {k.removeprefix("model/"): t for k, t in tensors.items() if k.startswith("model/") and any(k.startswith(f"model/{prefix}{b}.") for b in wanted)}
    return _apply(model, weights, folder, strict=True, require_all=False)


def _apply(model: nn.Module, weights: dict[str, torch.Tensor], folder: Path, strict: bool, require_all: bool) -> KeyReport:
    own = model.state_dict()
    unexpected = sorted(set(weights) - set(own))
    missing = sorted(set(own) - set(weights)) if require_all else []
    if strict and (missing or unexpected):
        raise StrictLoadError(
            f"{folder}: missing keys {missing[:8]}{'...' if len(missing) > 8 else ''}, unexpected keys "
            f"{unexpected[:8]}{'...' if len(unexpected) > 8 else ''}; build the model from the card it was saved with, "
            "or pass strict=False to load the matching part"
        )
    matching = {k: v for k, v in weights.items() if k in own}
    with torch.no_grad():
        for k, v in matching.items():
            if own[k].shape != v.shape:
                raise CheckpointError(f"{folder}: {k} has shape {tuple(v.shape)} in the checkpoint, {tuple(own[k].shape)} in the model")
            own[k].copy_(v)
    return KeyReport(sorted(matching), missing, unexpected)
