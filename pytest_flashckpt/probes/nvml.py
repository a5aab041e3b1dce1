"""The ``nvml`` probe: device memory in use, sampled in a thread through nvidia-ml-py (``import pynvml``).

It sees what the allocator cannot: the CUDA context, cuBLAS/cuDNN workspaces, the caching allocator's slack and
other processes. To report tensor-comparable numbers it separates the part that was already in use and not
reserved by PyTorch when tracking began (the CUDA context and everything outside this process's allocator):
``peak_bytes`` = peak used - that non-PyTorch part. The raw device peak and the context are reported apart in
``extra``. Uses the v2 memory query (``nvmlMemory_v2``: total, reserved, free, used), whose ``used`` excludes
driver-reserved memory; falls back to v1 where the driver lacks v2. Sampled, so a lower bound.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Iterator

from pytest_flashckpt.probes.base import MemoryReading
from pytest_flashckpt.probes.sampler import PeakSampler


class NvmlProbe:
    name = "nvml"

    def __init__(
        self,
        device=None,
        nvml=None,
        reserved_bytes: Callable[[], int] | None = None,
        interval_s: float = 0.001,
    ) -> None:
        if nvml is None:
            import pynvml as nvml  # provided by the nvidia-ml-py distribution
        self.nvml = nvml  # injectable: tests drive a fake NVML on machines without a GPU
        self.index = (device.index or 0) if device is not None else 0
        if reserved_bytes is None:
            import torch

            reserved_bytes = lambda: torch.cuda.memory_reserved(self.index)  # noqa: E731
        self.reserved_bytes = reserved_bytes
        self.interval_s = interval_s
        self.memory_api = "v2"

    def _used_reader(self, handle) -> Callable[[], int]:
        nvml = self.nvml
        v2 = getattr(nvml, "nvmlMemory_v2", None)
        if v2 is not None:
            try:
                nvml.nvmlDeviceGetMemoryInfo(handle, version=v2)
                return lambda: int(nvml.nvmlDeviceGetMemoryInfo(handle, version=v2).used)
            except nvml.NVMLError:
                pass
        self.memory_api = "v1"
        return lambda: int(nvml.nvmlDeviceGetMemoryInfo(handle).used)

    @contextlib.contextmanager
    def track(self, resident: Iterable = ()) -> Iterator[MemoryReading]:
        nvml = self.nvml
        nvml.nvmlInit()
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(self.index)
            read_used = self._used_reader(handle)
            sampler = PeakSampler(read_used, self.interval_s)
            outside_torch = sampler.first - self.reserved_bytes()  # CUDA context + other processes
            reading = MemoryReading(self.name, start_bytes=sampler.first - outside_torch, exact=False)
            try:
                with sampler:
                    yield reading
            finally:
                reading.peak_bytes = sampler.peak - outside_torch
                reading.end_bytes = sampler.last - outside_torch
                reading.extra.update(
                    nvml_peak_used_bytes=sampler.peak,
                    nvml_context_bytes=outside_torch,
                    nvml_samples=sampler.samples,
                    nvml_memory_api=self.memory_api,
                )
        finally:
            nvml.nvmlShutdown()
