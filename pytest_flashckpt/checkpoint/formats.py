"""Tensor files: ``torch`` (torch.save zip, read back only with ``weights_only=True``) and ``safetensors``.

Nothing here unpickles: a torch file that holds anything but tensors and plain containers is refused by
``torch.load(weights_only=True)`` before any of its code can run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from pytest_flashckpt.checkpoint.errors import CorruptCheckpointError

Format = Literal["torch", "safetensors"]
SUFFIX = {"torch": ".pt", "safetensors": ".safetensors"}


def write_tensor_file(path: Path, tensors: dict[str, torch.Tensor], fmt: Format) -> None:
    """Write ``tensors`` to ``path`` and fsync it, so that a later rename publishes durable bytes."""
    if fmt == "safetensors":
        save_file({k: t.contiguous() for k, t in tensors.items()}, str(path), metadata={"format": "pt"})  # as transformers writes
    elif fmt == "torch":
        torch.save(tensors, path)
    else:
        raise ValueError(f"unknown checkpoint format {fmt!r}; valid: torch, safetensors")
    fsync_path(path)


def read_tensor_file(path: Path, fmt: Format) -> dict[str, torch.Tensor]:
    """Read a tensor file written by :func:`write_tensor_file`; anything else is a ``CorruptCheckpointError``."""
    try:
        if fmt == "safetensors":
            return load_file(str(path), device="cpu")
        data = torch.load(path, map_location="cpu", weights_only=True)
    except (SafetensorError, RuntimeError, EOFError, ValueError, OSError) as exc:
        raise CorruptCheckpointError(
            f"{path}: not a readable {fmt} tensor file ({type(exc).__name__}: {str(exc).splitlines()[0][:300]}); "
            "it is refused without running any code in it. Delete the checkpoint folder or resume from an older one"
        ) from None
    except Exception as exc:  # weights_only unpickler errors are of assorted types
        raise CorruptCheckpointError(
            f"{path}: refused by torch.load(weights_only=True) ({type(exc).__name__}); a checkpoint file must hold only "
            "tensors. Delete it or resume from an older checkpoint"
        ) from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in data.items()):
        raise CorruptCheckpointError(f"{path}: expected a mapping of names to tensors, found {type(data).__name__}")
    return data


def fsync_path(path: Path) -> None:
    """fsync a file or a directory by path (directories: makes renames and new entries in them durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
