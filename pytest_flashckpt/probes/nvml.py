"""The ``nvml`` probe: device memory in use, sampled in a thread through nvidia-ml-py (``import pynvml``).

It sees what the allocator cannot: cuBLAS/cuDNN workspaces, the caching allocator's slack, other processes. Three
things make its number mean "this scenario's step" (see README "GPU runners"):

* **the right GPU**: NVML numbers devices physically, torch after ``CUDA_VISIBLE_DEVICES`` remapping, so the NVML
  device is found by the UUID torch reports for the scenario's device (``get_device_properties(i).uuid``), never
  by index;
* **a fresh start**: the CUDA context is created (if it was not) and the allocator's cache emptied before the
  first reading, so neither a context created by the step nor blocks cached by earlier scenarios count;
* **relative to the start**: ``peak_bytes`` = sampled peak used - used at the start + the scenario's own resident
  bytes (as the ``cuda`` probe). The context and everything outside PyTorch (used - reserved at the start) is
  reported apart as ``nvml_context_bytes``; the raw device peak as ``nvml_peak_used_bytes``.

Uses the v2 memory query (``nvmlMemory_v2``), whose ``used`` excludes driver-reserved memory; falls back to v1
where the driver lacks v2. Sampled, so a lower bound.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Callable, Iterable, Iterator

import torch

from pytest_flashckpt.probes.base import MemoryReading
from pytest_flashckpt.probes.cuda import resident_device_bytes
from pytest_flashckpt.probes.sampler import PeakSampler


def normalise_uuid(value) -> str:
    """``b'GPU-2c2d...'``, ``'GPU-2C2D...'`` and torch's ``'2c2d...'`` -> ``'2c2d...'`` (lower case, no prefix)."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    text = str(value).strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    return text


def nvml_handle_for(nvml, torch_uuid: str):
    """The NVML handle of the device whose UUID is ``torch_uuid``; an error listing what NVML sees otherwise."""
    wanted = normalise_uuid(torch_uuid)
    seen = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = normalise_uuid(nvml.nvmlDeviceGetUUID(handle))
        if uuid == wanted:
            return handle
        seen.append(f"{index}: {uuid}")
    for prefix in ("MIG-", "GPU-"):  # a MIG instance is not among the enumerated physical GPUs
        try:
            return nvml.nvmlDeviceGetHandleByUUID(prefix + wanted)
        except (nvml.NVMLError, AttributeError):
            continue
    raise RuntimeError(
        f"nvml probe: no NVML device has torch's UUID {wanted} (NVML sees {', '.join(seen) or 'no devices'}); "
        "is CUDA_VISIBLE_DEVICES naming a device this driver does not show?"
    )


class NvmlProbe:
    name = "nvml"

    def __init__(self, device=None, nvml=None, cuda=None, interval_s: float = 0.001) -> None:
        if nvml is None:  # imported here: nvidia-ml-py is an optional dependency, needed only by this probe
            import pynvml as nvml
        if cuda is None:
            cuda = torch.cuda
        self.nvml = nvml  # injectable: tests drive a fake NVML on machines without a GPU
        self.cuda = cuda  # injectable: torch.cuda's context, allocator and device-property calls
        self.index = (device.index or 0) if device is not None else 0
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

    def _fresh_start(self) -> bool:
        """Create the CUDA context if needed and empty the allocator's cache; True if the context was created here."""
        cuda = self.cuda
        created = not cuda.is_initialized()
        cuda.init()
        gc.collect()
        cuda.synchronize(self.index)
        with cuda.device(self.index):
            cuda.empty_cache()
        return created

    @contextlib.contextmanager
    def track(self, resident: Iterable = ()) -> Iterator[MemoryReading]:
        nvml, cuda = self.nvml, self.cuda
        own = resident_device_bytes(resident, _Device(self.index))
        created_context = self._fresh_start()
        nvml.nvmlInit()
        try:
            handle = nvml_handle_for(nvml, str(cuda.get_device_properties(self.index).uuid))
            read_used = self._used_reader(handle)
            sampler = PeakSampler(read_used, self.interval_s)
            start_used = sampler.first
            outside_torch = start_used - cuda.memory_reserved(self.index)  # CUDA context + other processes
            reading = MemoryReading(self.name, start_bytes=own, exact=False)
            try:
                with sampler:
                    yield reading
            finally:
                reading.peak_bytes = sampler.peak - start_used + own
                reading.end_bytes = sampler.last - start_used + own
                reading.extra.update(
                    nvml_peak_used_bytes=sampler.peak,
                    nvml_context_bytes=outside_torch,
                    nvml_context_created_by_probe=int(created_context),
                    nvml_samples=sampler.samples,
                    nvml_memory_api=self.memory_api,
                )
        finally:
            nvml.nvmlShutdown()


class _Device:
    """A minimal stand-in for ``torch.device('cuda', index)`` (keeps this module free of a torch import)."""

    type = "cuda"

    def __init__(self, index: int) -> None:
        self.index = index
