"""The ``cuda`` probe: the caching allocator's peak of allocated tensor memory (``max_memory_allocated``)
after ``reset_peak_memory_stats``. Exact for what PyTorch allocates (rounded to the allocator's 512-byte blocks)."""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

from pytest_flashckpt.probes.base import MemoryReading


class CudaAllocatorProbe:
    name = "cuda"

    def __init__(self, device=None, cuda=None) -> None:
        if cuda is None:
            import torch

            cuda = torch.cuda
        self.cuda = cuda  # injectable for tests on machines without a GPU
        self.device = device

    @contextlib.contextmanager
    def track(self, resident: Iterable = ()) -> Iterator[MemoryReading]:
        cuda, device = self.cuda, self.device
        cuda.synchronize(device)
        cuda.reset_peak_memory_stats(device)
        reading = MemoryReading(self.name, start_bytes=cuda.memory_allocated(device), exact=True)
        try:
            yield reading
        finally:
            cuda.synchronize(device)
            reading.peak_bytes = cuda.max_memory_allocated(device)
            reading.end_bytes = cuda.memory_allocated(device)
            reading.extra["cuda_peak_reserved_bytes"] = cuda.max_memory_reserved(device)
