"""This machine's physical limits for a save: raw write bandwidth with fsync, and memory-copy bandwidth.

``write_MBps`` of a save is read against :func:`write_bandwidth_MBps` (same folder, same fsync), and an async save's
stall against ``snapshot bytes / copy_bandwidth_GBps`` (the copy it cannot avoid).
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import torch


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


def copy_bandwidth_GBps(megabytes: int = 64, repeats: int = 3) -> float:
    """Best of ``repeats`` ``copy_`` of ``megabytes`` into an already touched buffer (what a staging snapshot does)."""
    n = (megabytes << 20) // 4
    src = torch.rand(n)
    dst = torch.zeros(n)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return n * 4 / 1e9 / best
