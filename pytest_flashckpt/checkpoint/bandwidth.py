"""This machine's physical limits for a save: raw write bandwidth with fsync, and memory-copy bandwidth.

``write_MBps`` of a save is read against :func:`write_bandwidth_MBps` (same folder, same fsync), and an async save's
stall against ``snapshot bytes / copy_bandwidth_GBps`` (the copy it cannot avoid). For state on a GPU that copy is
device-to-host into pinned memory (what the staging area does), so that is what :func:`copy_bandwidth_GBps` times
when given a CUDA device; a host memcpy would be an order of magnitude off.

:class:`SnapshotCopyTimer` times the copy itself, per save, in the training loop just before the save: a staged
save's stall over that copy (``stall_vs_copy``) is a ratio of two neighbouring measurements of the same bytes on the
same machine state, so a busier or quieter machine, or another process, moves both alike (docs: baselines/README.md).

:func:`against_limits` states both against their limit as fractions: ``write_vs_raw`` (a save's write rate over the
raw disk's) and ``staging_vs_copy`` (the staging copy's rate, snapshot bytes / ``snapshot_copy_s``, over the
measured memory copy: host to host on a CPU, device to pinned host on a GPU).
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import torch

from pytest_flashckpt.checkpoint.staging import StagingArea


def write_bandwidth_MBps(folder: Path, megabytes: int = 64, chunk_mb: int = 8) -> float:
    """Write ``megabytes`` of random bytes to a temporary file in ``folder``, fsync, and time it (file removed)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    chunk = os.urandom(chunk_mb << 20)
    path = folder / f".tmp-bandwidth-{uuid.uuid4().hex[:8]}"
    written = 0
    try:
        start = time.perf_counter()
        with open(path, "wb") as fh:
            while written < megabytes << 20:
                fh.write(chunk)
                written += len(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        elapsed = time.perf_counter() - start
    finally:
        path.unlink(missing_ok=True)
    return written / 1e6 / elapsed


def copy_bandwidth_GBps(megabytes: int = 64, repeats: int = 3, device: torch.device | None = None, synchronize=None) -> float:
    """Best of ``repeats`` ``copy_`` of ``megabytes`` into an already touched buffer (what a staging snapshot does):
    host to host, or from ``device`` into pinned host memory when it is a CUDA device (``synchronize`` is
    injectable for tests; default ``torch.cuda.synchronize``)."""
    if device is not None and torch.device(device).type == "cuda":
        return _device_to_host_GBps(torch.device(device), megabytes, repeats, synchronize or torch.cuda.synchronize)
    n = (megabytes << 20) // 4
    src = torch.rand(n)
    dst = torch.zeros(n)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return n * 4 / 1e9 / best


def _device_to_host_GBps(device: torch.device, megabytes: int, repeats: int, synchronize) -> float:
    n = (megabytes << 20) // 4
    src = torch.empty(n, dtype=torch.float32, device=device)
    dst = torch.empty(n, dtype=torch.float32, pin_memory=True)
    dst.copy_(src, non_blocking=True)  # first copy: page-locked mapping warmed, not timed
    synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return n * 4 / 1e9 / max(best, 1e-9)


def against_limits(measured: dict) -> dict[str, float]:
    """``staging_GBps`` and ``staging_vs_copy`` from a checkpoint pass's ``snapshot_bytes``, ``snapshot_copy_s`` and
    ``copy_GBps`` (staged saves only: a blocking save has no staging copy, so nothing is returned for it)."""
    nbytes, copy_s, copy_gbps = (measured.get(k) for k in ("snapshot_bytes", "snapshot_copy_s", "copy_GBps"))
    if not (isinstance(nbytes, (int, float)) and isinstance(copy_s, (int, float)) and isinstance(copy_gbps, (int, float))):
        return {}
    if nbytes <= 0 or copy_s <= 0 or copy_gbps <= 0:
        return {}
    staging = nbytes / copy_s / 1e9
    return {"staging_GBps": staging, "staging_vs_copy": staging / copy_gbps}


class SnapshotCopyTimer:
    """Times a blocking staging snapshot of the given tensors into its own reused :class:`StagingArea` (the same code
    and the same kind of buffers an async save copies into; pinned host memory for GPU state): what a staged save
    cannot avoid paying, measured now. The buffers are allocated and touched on the first call, which is not timed."""

    def __init__(self) -> None:
        self._staging = StagingArea()
        self._warm = False

    def time(self, tensors: dict[str, torch.Tensor]) -> float:
        if not self._warm:
            self._staging.snapshot(tensors)
            self._warm = True
        start = time.perf_counter()
        self._staging.snapshot(tensors)
        return time.perf_counter() - start
