"""Disk space: checked before a save, and a disk that fills up during one named as such.

Before a save (``check_free_space``): the bytes it needs (``bytes_needed``: the tensors the save's files hold plus a
bound on what the formats add) against ``shutil.disk_usage`` of the root's filesystem (the space an unprivileged
writer may use), refused with "needs X, Y free on <mount>" before the temporary folder is created. The old
checkpoint that ``max_keep`` rotates out is deleted only after the new one is committed, so it is no credit.

During a write (``disk_full_during_write``): another process can fill the disk after the check (and quotas are not
in ``statvfs``). The writers report it in their own words: ``OSError`` ENOSPC/EDQUOT from Python, safetensors'
"No space left on device (os error 28)", DCP's ``CheckpointException`` (a ``BaseException``) around its ranks'
errors, and torch's zip writer only ``unexpected pos 576 vs 534`` (no errno: its short write). The last is taken
for a full disk only when the rest of the save no longer fits in the space now free.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

from pytest_flashckpt.checkpoint.errors import DiskFullError
from pytest_flashckpt.checkpoint.payload import Payload
from pytest_flashckpt.core.numbers import mib

# What the formats add to the tensor bytes, bounded per tensor and per save. Per tensor: a torch zip record (local
# header, central directory entry, 64-byte alignment, its pickle entry), a safetensors header entry or a DCP
# metadata entry, the tensor's meta.json spec, and one filesystem block of rounding, were every tensor its own file
# (layer-wise saves are one file per block): under 8 KiB. Per save: meta.json's JSON tree (measured: its length) and
# a fixed 1 MiB for manifest.json, DCP's .metadata header and the folder entries.
PER_TENSOR_BYTES = 8 << 10
PER_SAVE_BYTES = 1 << 20
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_FULL_TEXT = ("no space left on device", "os error 28", "disk quota exceeded", "os error 122")


def bytes_needed(payload: Payload) -> int:
    """An upper bound of the bytes one save of ``payload`` writes: its files' tensors plus the formats' overhead."""
    keys = {k for keys in payload.files.values() for k in keys}
    tensors = sum(payload.tensors[k].numel() * payload.tensors[k].element_size() for k in keys)
    return tensors + PER_TENSOR_BYTES * len(keys) + PER_SAVE_BYTES + len(json.dumps(payload.tree))


def mount_point(path: Path) -> Path:
    """The mount point of the filesystem holding ``path`` (which exists)."""
    here = Path(os.path.realpath(path))
    while not os.path.ismount(here):
        here = here.parent
    return here


def where(root: Path) -> str:
    mount = mount_point(root)
    return f"{mount} (the filesystem holding {root})" if mount != Path(os.path.realpath(root)) else str(mount)


def check_free_space(root: Path, needed: int, what: str) -> None:
    """Refuse (``DiskFullError``) a save of ``needed`` bytes that the filesystem of ``root`` has no room for."""
    free = shutil.disk_usage(root).free
    if free < needed:
        raise DiskFullError(
            f"{what} refused: needs {mib(needed)}, {mib(free)} free on {where(root)}; nothing was written. Free space, "
            "lower max_keep to keep fewer checkpoints, or choose a checkpoint root on a larger disk"
        )


def _causes(exc: BaseException):
    """``exc`` and what it wraps: ``__cause__`` / ``__context__`` chains and DCP's per-rank failures."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__]
        failures = getattr(e, "failures", None)  # torch.distributed.checkpoint.api.CheckpointException
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values() if isinstance(f, (tuple, BaseException))]


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def disk_full_during_write(exc: BaseException, tmp: Path, needed: int) -> str | None:
    """Why a write into ``tmp`` failed, when it was the disk filling up (``needed``: the save's bound); None for any
    other failure. Call it before removing ``tmp``: what it holds is what was written."""
    evidence = None
    for e in _causes(exc):
        text = str(e).lower()
        if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
            evidence = os.strerror(e.errno)
        elif any(t in text for t in _FULL_TEXT):
            evidence = next(line.strip() for line in str(e).splitlines() if any(t in line.lower() for t in _FULL_TEXT))[:200]
        if evidence:
            break
    root = tmp.parent
    try:
        free = shutil.disk_usage(root).free
        written = _folder_bytes(tmp) if tmp.is_dir() else 0
    except OSError:
        return None
    if evidence is None:
        short = next((str(e) for e in _causes(exc) if "unexpected pos" in str(e)), None)
        if short is None or free >= needed - written:
            return None  # a short write with room left: some other I/O failure, reported as it is
        evidence = f"torch's writer stopped short: {short[short.index('unexpected pos'):].splitlines()[0].strip()!r}"
    return (
        f"no space left on the device holding {root}: it filled up during the write ({evidence}); the save needs "
        f"{mib(needed)}, {mib(written)} were written, {mib(free)} is free now on {mount_point(root)}. Free space, lower max_keep to keep fewer checkpoints, or choose a "
        "checkpoint root on a larger disk"
    )
