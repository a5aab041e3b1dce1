"""Writing one checkpoint's content into its (temporary) folder: tensor files plus ``meta.json``.

``meta.json`` holds the JSON tree of the training state and, for every tensor key, the file that holds it with its
dtype and shape (what DCP needs to preallocate, and what a partial load needs to find a block's file).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pytest_flashckpt.checkpoint import dcp_io, formats
from pytest_flashckpt.checkpoint.formats import fsync_path

META = "meta.json"


@dataclass
class Payload:
    """What to write: ``files`` maps a relative file (or the DCP folder) to the tensor keys it holds."""

    tensors: dict[str, torch.Tensor]
    tree: dict[str, Any]
    files: dict[str, list[str]]
    format: str  # torch | safetensors | dcp
    base: str | None = None


def tensor_spec(payload: Payload) -> dict[str, dict[str, Any]]:
    spec = {}
    for rel, keys in payload.files.items():
        for key in keys:
            t = payload.tensors[key]
            spec[key] = {"file": rel, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
    return spec


def write_meta(folder: Path, payload: Payload, step: int, strategy: str) -> None:
    meta = {"step": step, "strategy": strategy, "format": payload.format, "base": payload.base, "tree": payload.tree, "tensors": tensor_spec(payload)}
    path = folder / META
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(meta, fh)
        fh.flush()
    fsync_path(path)


def write_tensors(folder: Path, payload: Payload) -> None:
    """Write every tensor file (synchronously, fsynced)."""
    for rel, keys in payload.files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        subset = {k: payload.tensors[k] for k in keys}
        if payload.format == "dcp":
            dcp_io.save(subset, path)
            for f in path.rglob("*"):
                if f.is_file():
                    fsync_path(f)
        else:
            formats.write_tensor_file(path, subset, payload.format)  # type: ignore[arg-type]


def read_meta(folder: Path) -> dict[str, Any]:
    return json.loads((folder / META).read_text(encoding="utf-8"))
