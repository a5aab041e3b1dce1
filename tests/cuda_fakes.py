"""Fakes that model the CUDA-side APIs the probes, staging and timing code call, for machines without a GPU.

``FakeCudaDevice`` models one GPU as the real APIs see it: a CUDA context that costs memory once created, the
caching allocator (``memory_allocated`` counts *every* live tensor of the process, ``memory_reserved`` also the
cached free blocks until ``empty_cache``; the peak only resets with ``reset_peak_memory_stats``), and NVML's
device-wide ``used`` (context + reserved + other processes). ``FakeTorchCuda`` is the ``torch.cuda`` surface over
several such devices, with a current device that ``device(i)`` switches; ``FakeNVML`` numbers devices physically
(its indices differ from torch's under ``CUDA_VISIBLE_DEVICES``) and reports UUIDs as ``GPU-<uuid>``.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from dataclasses import dataclass, field


@dataclass
class FakeCudaDevice:
    uuid: str
    context_bytes: int = 500 * 2**20
    other_process_bytes: int = 0
    context: bool = False
    live: dict[int, int] = field(default_factory=dict)  # handle -> allocated bytes
    cached: int = 0  # freed blocks kept by the caching allocator
    peak_allocated: int = 0
    peak_reserved: int = 0

    @property
    def allocated(self) -> int:
        return sum(self.live.values())

    @property
    def reserved(self) -> int:
        return self.allocated + self.cached

    @property
    def nvml_used(self) -> int:
        return (self.context_bytes if self.context else 0) + self.reserved + self.other_process_bytes


class FakeTorchCuda:
    """``torch.cuda`` as the probes use it; every call also logged in ``calls`` as (name, device index)."""

    def __init__(self, uuids=("aaaa0000-0000-0000-0000-000000000000",)) -> None:
        self.devices = [FakeCudaDevice(u) for u in uuids]
        self.current = 0
        self.calls: list[tuple[str, int]] = []
        self._handles = itertools.count()
        self.lock = threading.Lock()

    # -- device selection ------------------------------------------------------------------------
    def _index(self, device) -> int:
        if device is None:
            return self.current
        if isinstance(device, int):
            return device
        return device.index if device.index is not None else self.current

    def _dev(self, device) -> FakeCudaDevice:
        return self.devices[self._index(device)]

    @contextlib.contextmanager
    def device(self, device):
        previous = self.current
        if device is not None and self._index(device) >= 0:
            self.current = self._index(device)
        try:
            yield
        finally:
            self.current = previous

    def current_device(self) -> int:
        return self.current

    # -- context ---------------------------------------------------------------------------------
    def is_initialized(self) -> bool:
        return any(d.context for d in self.devices)

    def init(self) -> None:
        self.devices[self.current].context = True

    def synchronize(self, device=None) -> None:
        self.calls.append(("synchronize", self._index(device)))
        self._dev(device).context = True

    def get_device_properties(self, device):
        dev = self._dev(device)
        return type("Props", (), {"uuid": dev.uuid, "total_memory": 80 * 2**30, "name": "Fake H200"})()

    # -- allocator -------------------------------------------------------------------------------
    def alloc(self, nbytes: int, device=None) -> int:
        """Allocate on ``device`` (default: the current one); returns a handle for ``free``."""
        dev = self._dev(device)
        dev.context = True
        with self.lock:
            handle = next(self._handles)
            reuse = min(dev.cached, nbytes)
            dev.cached -= reuse
            dev.live[handle] = nbytes
            dev.peak_allocated = max(dev.peak_allocated, dev.allocated)
            dev.peak_reserved = max(dev.peak_reserved, dev.reserved)
        return handle

    def free(self, handle: int, device=None) -> None:
        dev = self._dev(device)
        with self.lock:
            dev.cached += dev.live.pop(handle)

    def empty_cache(self) -> None:
        self.calls.append(("empty_cache", self.current))
        self.devices[self.current].cached = 0

    def reset_peak_memory_stats(self, device=None) -> None:
        self.calls.append(("reset", self._index(device)))
        dev = self._dev(device)
        dev.peak_allocated, dev.peak_reserved = dev.allocated, dev.reserved

    def memory_allocated(self, device=None) -> int:
        return self._dev(device).allocated

    def max_memory_allocated(self, device=None) -> int:
        return self._dev(device).peak_allocated

    def memory_reserved(self, device=None) -> int:
        return self._dev(device).reserved

    def max_memory_reserved(self, device=None) -> int:
        return self._dev(device).peak_reserved


class FakeNVML:
    """pynvml over the physical GPUs: ``physical`` lists devices in NVML order (torch may see a subset, reordered)."""

    class NVMLError(Exception):
        pass

    nvmlMemory_v2 = 0x02000028

    def __init__(self, physical: list[FakeCudaDevice], support_v2: bool = True) -> None:
        self.physical = physical
        self.support_v2 = support_v2
        self.initialised = 0
        self.versions: list = []

    def nvmlInit(self) -> None:
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.physical)

    def nvmlDeviceGetHandleByIndex(self, index: int):
        return self.physical[index]

    def nvmlDeviceGetUUID(self, handle) -> str:
        return "GPU-" + handle.uuid.upper()

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        if version is not None and not self.support_v2:
            raise self.NVMLError("Function Not Found")
        self.versions.append(version)
        used = handle.nvml_used
        return type("Memory", (), {"used": used, "total": 141 * 2**30, "free": 141 * 2**30 - used})()


@dataclass
class FakeTensor:
    """Enough of a tensor for resident-byte accounting: a device and a storage with a pointer and a size."""

    nbytes: int
    device_index: int = 0
    ptr: int = field(default_factory=lambda: next(_PTRS))

    @property
    def device(self):
        import torch

        return torch.device("cuda", self.device_index)

    def untyped_storage(self):
        outer = self
        return type("Storage", (), {"nbytes": lambda self: outer.nbytes, "data_ptr": lambda self: outer.ptr})()


_PTRS = itertools.count(4096, 4096)
