"""The cuda and nvml probes' logic, driven by fakes on a machine without a GPU; the real ones run only where
CUDA is present."""

import mmap
import threading
import time

import pytest
import torch

from pytest_flashckpt.probes import make_probe
from pytest_flashckpt.probes.cuda import CudaAllocatorProbe
from pytest_flashckpt.probes.nvml import NvmlProbe
from pytest_flashckpt.probes.rss import RssProbe, resident_bytes


class FakeCuda:
    """Mimics torch.cuda's allocator statistics."""

    def __init__(self):
        self.allocated = 1000
        self.peak = 5000
        self.calls = []

    def synchronize(self, device=None):
        self.calls.append("synchronize")

    def reset_peak_memory_stats(self, device=None):
        self.calls.append("reset")
        self.peak = self.allocated

    def memory_allocated(self, device=None):
        return self.allocated

    def max_memory_allocated(self, device=None):
        return self.peak

    def max_memory_reserved(self, device=None):
        return self.peak + 2048

    def alloc(self, n):
        self.allocated += n
        self.peak = max(self.peak, self.allocated)


def test_cuda_probe_resets_peak_and_reports_allocator_peak():
    cuda = FakeCuda()
    with CudaAllocatorProbe(cuda=cuda).track() as reading:
        cuda.alloc(3000)
        cuda.alloc(-2500)
    assert cuda.calls[:2] == ["synchronize", "reset"]  # a stale peak from before tracking never leaks in
    assert (reading.start_bytes, reading.peak_bytes, reading.end_bytes) == (1000, 4000, 1500)
    assert reading.extra["cuda_peak_reserved_bytes"] == 6048
    assert reading.exact


class FakeNVML:
    """Mimics pynvml: v2 memory info whose `used` follows a script of values, one per query."""

    class NVMLError(Exception):
        pass

    nvmlMemory_v2 = 0x02000028

    def __init__(self, used_values, support_v2=True):
        self.values = list(used_values)
        self.support_v2 = support_v2
        self.versions = []
        self.lock = threading.Lock()
        self.initialised = 0

    def nvmlInit(self):
        self.initialised += 1

    def nvmlShutdown(self):
        self.initialised -= 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("handle", index)

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        if version is not None and not self.support_v2:
            raise self.NVMLError("Function Not Found")
        with self.lock:
            self.versions.append(version)
            value = self.values.pop(0) if len(self.values) > 1 else self.values[0]
        return type("Memory", (), {"used": value, "total": 10**10, "free": 10**10 - value, "reserved": 512})()


def test_nvml_probe_samples_peak_and_separates_context():
    # queries: v2 probe, first reading (context 300 + torch 700 reserved), then a rise and fall
    nvml = FakeNVML([1000, 1000, 1400, 2600, 1800, 1200])
    probe = NvmlProbe(nvml=nvml, reserved_bytes=lambda: 700, interval_s=0.0005)
    with probe.track() as reading:
        deadline = time.monotonic() + 2
        while len(nvml.values) > 1 and time.monotonic() < deadline:
            time.sleep(0.001)
    assert reading.extra["nvml_context_bytes"] == 300
    assert reading.extra["nvml_peak_used_bytes"] == 2600
    assert reading.peak_bytes == 2300  # device peak minus the non-PyTorch part
    assert reading.start_bytes == 700
    assert not reading.exact  # sampled: a lower bound
    assert reading.extra["nvml_memory_api"] == "v2"
    assert set(nvml.versions) == {FakeNVML.nvmlMemory_v2}
    assert nvml.initialised == 0  # nvmlShutdown always paired with nvmlInit


def test_nvml_probe_falls_back_to_v1_when_driver_lacks_v2():
    nvml = FakeNVML([500], support_v2=False)
    with NvmlProbe(nvml=nvml, reserved_bytes=lambda: 0).track() as reading:
        pass
    assert reading.extra["nvml_memory_api"] == "v1"
    assert reading.peak_bytes == 0 and reading.extra["nvml_context_bytes"] == 500


def test_sampler_failure_surfaces():
    nvml = FakeNVML([100, 100, 100])
    calls = {"n": 0}
    real = nvml.nvmlDeviceGetMemoryInfo

    def flaky(handle, version=None):
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("GPU fell off the bus")
        return real(handle, version)

    nvml.nvmlDeviceGetMemoryInfo = flaky
    with pytest.raises(RuntimeError, match="memory sampler failed: GPU fell off the bus"):
        with NvmlProbe(nvml=nvml, reserved_bytes=lambda: 0, interval_s=0.0005).track():
            time.sleep(0.05)


def test_rss_probe_sees_a_large_allocation():
    """Fresh anonymous pages (mmap, each touched) always raise the resident set: unlike a tensor, they cannot
    come from memory the allocator already holds."""
    size = 64 * 2**20
    with RssProbe(interval_s=0.0005).track() as reading:
        block = mmap.mmap(-1, size)
        for offset in range(0, size, mmap.PAGESIZE):
            block[offset] = 1
        time.sleep(0.02)
        block.close()
    assert reading.peak_bytes - reading.start_bytes >= size // 2
    assert resident_bytes() > 0


def test_unknown_probe_name_lists_valid_ones():
    with pytest.raises(ValueError, match="valid: cpu, cuda, nvml, rss"):
        make_probe("gpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; this machine has none")
def test_real_cuda_and_nvml_probes_agree_on_a_large_allocation():
    device = torch.device("cuda:0")
    with make_probe("nvml", device).track() as nvml_reading, make_probe("cuda", device).track() as cuda_reading:
        block = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
        torch.cuda.synchronize()
        time.sleep(0.05)
        del block
    assert cuda_reading.peak_bytes - cuda_reading.start_bytes >= 256 * 2**20
    assert nvml_reading.peak_bytes >= 256 * 2**20 * 0.9
