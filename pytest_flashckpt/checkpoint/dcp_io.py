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
from typing import Iterator

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

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


def load(folder: Path, spec: dict[str, dict]) -> dict[str, torch.Tensor]:
    """Read tensors described by ``spec`` ({key: {"dtype", "shape"}}) from a DCP folder."""
    out = {k: torch.empty(v["shape"], dtype=getattr(torch, v["dtype"])) for k, v in spec.items()}
    try:
        with process_group():
            dcp.load(out, checkpoint_id=str(folder))
    except Exception as exc:  # DCP raises CheckpointException and others
        raise CorruptCheckpointError(f"{folder}: torch.distributed.checkpoint could not read it ({type(exc).__name__}: {str(exc)[:300]})") from None
    return out
