"""The manifest: what a complete checkpoint contains, written last inside the temporary folder.

It lists every file with its size and sha256, plus step, strategy, configuration and library versions. A folder
without a valid manifest, or whose files do not match it, is never loaded.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import torch

import pytest_flashckpt
from pytest_flashckpt.checkpoint.errors import CorruptCheckpointError, NoCheckpointError
from pytest_flashckpt.checkpoint.formats import fsync_path
from pytest_flashckpt.checkpoint.paths import confined

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
_CHUNK = 8 << 20


@dataclass
class Manifest:
    name: str
    step: int
    strategy: str
    format: str
    config: dict[str, Any]
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # relative path -> {"bytes", "sha256"}
    base: str | None = None  # selective: the full checkpoint these tensors are restored on top of
    versions: dict[str, str] = field(default_factory=dict)
    created: float = 0.0
    manifest_version: int = MANIFEST_VERSION

    @property
    def bytes(self) -> int:
        return sum(int(f["bytes"]) for f in self.files.values())


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def versions() -> dict[str, str]:
    return {
        "torch": torch.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "pytest_flashckpt": pytest_flashckpt.__version__,
    }


def write_manifest(folder: Path, manifest: Manifest) -> int:
    """Hash every file under ``folder``, write and fsync ``manifest.json``; returns the manifest's size."""
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        rel = path.relative_to(folder).as_posix()
        manifest.files[rel] = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
    manifest.versions = versions()
    manifest.created = time.time()
    target = folder / MANIFEST
    text = json.dumps(manifest.__dict__, indent=1, sort_keys=True)
    with open(target, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
    fsync_path(target)
    return target.stat().st_size


def read_manifest(folder: Path) -> Manifest:
    target = folder / MANIFEST
    if not folder.is_dir():
        raise NoCheckpointError(f"{folder}: no such checkpoint folder (never written, deleted or moved)")
    if not target.is_file():
        raise CorruptCheckpointError(f"{target}: missing; {folder} is not a complete checkpoint (a save that never committed)")
    confined(folder, MANIFEST, "manifest")  # a manifest.json symlinked out of the folder is not read
    try:
        data = json.loads(target.read_text(encoding="utf-8"))
        manifest = Manifest(**data)
    except (ValueError, TypeError) as exc:
        raise CorruptCheckpointError(f"{target}: unreadable manifest ({exc}); delete {folder} or resume from an older checkpoint") from None
    entries_ok = isinstance(manifest.files, dict) and all(
        isinstance(info, dict) and type(info.get("bytes")) is int and isinstance(info.get("sha256"), str) for info in manifest.files.values()
    )
    if not entries_ok or not isinstance(manifest.base, (str, type(None))) or not isinstance(manifest.versions, dict):
        raise CorruptCheckpointError(f"{target}: malformed manifest (files must map names to {{bytes, sha256}}); delete {folder} or resume from an older checkpoint")
    return manifest


def verify(folder: Path) -> Manifest:
    """Check every file the manifest lists (presence, size, sha256); the first mismatch is an error naming it.
    Every entry must name a file inside ``folder`` (``paths.confined``: no absolute path, ``..`` or symlink out)."""
    manifest = read_manifest(folder)
    for rel in manifest.files:  # every entry confined first: nothing outside the folder is even hashed
        confined(folder, rel, f"{MANIFEST} entry")
    for rel, expected in manifest.files.items():
        path = folder / rel
        if not path.is_file():
            raise CorruptCheckpointError(f"{path}: missing (listed in {folder / MANIFEST}); the checkpoint is incomplete")
        size = path.stat().st_size
        if size != expected["bytes"]:
            raise CorruptCheckpointError(f"{path}: {size} bytes, the manifest says {expected['bytes']} (truncated or overwritten)")
        if sha256_file(path) != expected["sha256"]:
            raise CorruptCheckpointError(f"{path}: sha256 does not match the manifest (corrupted on disk)")
    return manifest
