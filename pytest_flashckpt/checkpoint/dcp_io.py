"""``torch.distributed.checkpoint`` as a save strategy, to compare with ours on the same state.

DCP in a single process without a process group warns ("assuming the intent is to save in a single process") on
every call; instead a one-rank gloo group over an in-memory ``HashStore`` (no port, no network) is created for the
duration of the call and destroyed afterwards, unless the caller already runs one.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Iterable, Iterator

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from pytest_flashckpt.checkpoint import safe_dcp
from pytest_flashckpt.checkpoint.errors import CorruptCheckpointError

DCP_DIR = "dcp"


_lock = threading.Lock()
_users = 0  # holders of the group this module created (0 when it created none)


@contextlib.contextmanager
def process_group() -> Iterator[None]:
    """A 1-rank gloo group if none is initialised (destroyed when its last user exits); the caller's otherwise."""
    global _users
    with _lock:
        if _users == 0 and dist.is_initialized():
            owned = False
        else:
            owned = True
            if _users == 0:
                dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
            _users += 1
    try:
        yield
    finally:
        if owned:
            with _lock:
                _users -= 1
                if _users == 0:
                    dist.destroy_process_group()


def save(tensors: dict[str, torch.Tensor], folder: Path) -> None:
    dcp.save(dict(tensors), checkpoint_id=str(folder))


def async_save(tensors: dict[str, torch.Tensor], folder: Path) -> Future:
    """DCP stages (copies) the tensors before returning; the future completes when the files are written."""
    return dcp.async_save(dict(tensors), checkpoint_id=str(folder))


def load(folder: Path, spec: dict[str, dict], listed: Iterable[str] | None = None, prefix: str = "") -> dict[str, torch.Tensor]:
    """Read tensors described by ``spec`` ({key: {"dtype", "shape"}}) from a DCP folder, through the safe reader
    (``safe_dcp``: no code runs from its ``.metadata``; shard files must be among ``listed``, the manifest's files)."""
    md = safe_dcp.read_metadata(folder, listed, prefix)  # a refusal is its own clear error, raised before DCP starts
    for key, want in spec.items():  # meta.json and .metadata must agree before anything is allocated
        entry = md.state_dict_metadata.get(key)
        if not isinstance(entry, safe_dcp.TensorStorageMetadata) or list(entry.size) != list(want["shape"]) or str(entry.properties.dtype) != f"torch.{want['dtype']}":
            raise CorruptCheckpointError(f"{folder}: tensor {key!r} is {want['dtype']} {want['shape']} in meta.json but not in the DCP metadata; the checkpoint is inconsistent")
    out = {k: torch.empty(v["shape"], dtype=getattr(torch, v["dtype"])) for k, v in spec.items()}
    with process_group():
        safe_dcp.load(out, folder, metadata=md)  # the metadata checked above; any failure: a CorruptCheckpointError
    return out
