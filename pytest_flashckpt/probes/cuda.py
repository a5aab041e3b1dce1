"""The ``cuda`` probe: the caching allocator's peak of allocated tensor memory, counted for *this scenario only*.

``torch.cuda.memory_allocated`` is device-wide: it includes every tensor alive in the process (other scenarios'
trainers, a reference model kept for timing, garbage held by reference cycles that activation checkpointing
creates). So tracking starts from a clean point: ``gc.collect()`` (frees cycle garbage), ``synchronize``,
``empty_cache()`` and ``reset_peak_memory_stats``; then

    peak_bytes  = max_memory_allocated - allocated_at_start + own resident bytes
    start_bytes = own resident bytes (``resident``: the scenario's parameters, optimizer state, ...)

Everything else alive at the start cancels out, so the number is the same whether the scenario runs alone or
after others. Resident bytes are rounded as the allocator rounds a block (512 bytes), so they are comparable with
its counters. Exact for what PyTorch allocates; see README "GPU runners".
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterable, Iterator

import torch

from pytest_flashckpt.probes.base import MemoryReading

ALLOCATOR_BLOCK = 512  # the CUDA caching allocator rounds every allocation up to a multiple of 512 bytes


def allocator_rounded(nbytes: int) -> int:
    """Bytes the caching allocator accounts for an allocation of ``nbytes`` (0 stays 0)."""
    return -(-nbytes // ALLOCATOR_BLOCK) * ALLOCATOR_BLOCK


def resident_device_bytes(resident: Iterable, device) -> int:
    """Bytes of the distinct storages among ``resident`` that live on ``device`` (views counted once)."""
    seen: set[int] = set()
    total = 0
    for tensor in resident:
        if getattr(tensor, "device", None) is None or not _same_device(tensor.device, device):
            continue
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += allocator_rounded(storage.nbytes())
    return total


def _same_device(a, b) -> bool:
    if b is None:
        return a.type == "cuda"
    return a.type == b.type and (a.index or 0) == (b.index or 0)


class CudaAllocatorProbe:
    name = "cuda"

    def __init__(self, device=None, cuda=None) -> None:
        self.cuda = cuda if cuda is not None else torch.cuda  # injectable for tests on machines without a GPU
        self.device = device

    @contextlib.contextmanager
    def track(self, resident: Iterable = ()) -> Iterator[MemoryReading]:
        cuda, device = self.cuda, self.device
        own = resident_device_bytes(resident, device)
        gc.collect()  # garbage in reference cycles (checkpointed graphs) would otherwise stay allocated
        cuda.synchronize(device)
        with cuda.device(device):  # empty_cache acts on the current device
            cuda.empty_cache()
        cuda.reset_peak_memory_stats(device)
        base = cuda.memory_allocated(device)
        reading = MemoryReading(self.name, start_bytes=own, exact=True)
        reading.extra["cuda_other_live_bytes"] = base - own  # alive at the start, not this scenario's
        try:
            yield reading
        finally:
            cuda.synchronize(device)
            reading.peak_bytes = cuda.max_memory_allocated(device) - base + own
            reading.end_bytes = cuda.memory_allocated(device) - base + own
            reading.extra["cuda_peak_reserved_bytes"] = cuda.max_memory_reserved(device)
