"""The cuda and nvml probes' logic, driven by fakes on a machine without a GPU; the real ones run only where
CUDA is present."""

import gc
import mmap
import time

import pytest
import torch
from cuda_fakes import FakeCudaDevice, FakeNVML, FakeTensor, FakeTorchCuda

from pytest_flashckpt.probes import make_probe
from pytest_flashckpt.probes.cuda import CudaAllocatorProbe, allocator_rounded
from pytest_flashckpt.probes.nvml import NvmlProbe, normalise_uuid
from pytest_flashckpt.probes.rss import RssProbe, resident_bytes


def test_cuda_probe_counts_only_the_scenario_however_much_else_is_alive():
    """Another trainer alive on the device (and cached blocks from earlier scenarios) change nothing: peak and
    state are the scenario's own, the same as when it runs alone."""

    def scenario(cuda):
        params = [FakeTensor(4096), FakeTensor(10_000)]
        for t in params:
            cuda.alloc(allocator_rounded(t.nbytes))
        probe = CudaAllocatorProbe(cuda=cuda)
        with probe.track(resident=[*params, params[0]]) as reading:  # a repeated tensor is counted once
            a = cuda.alloc(3000)
            b = cuda.alloc(6000)
            cuda.free(a)
            cuda.free(b)
        return reading

    alone = scenario(FakeTorchCuda())
    busy = FakeTorchCuda()
    for _ in range(3):  # another scenario's reference trainer, and garbage it cached
        busy.alloc(1 << 20)
    busy.free(busy.alloc(5 << 20))
    in_suite = scenario(busy)
    own = 4096 + allocator_rounded(10_000)
    assert (alone.start_bytes, alone.peak_bytes, alone.end_bytes) == (own, own + 9000, own)
    assert (in_suite.start_bytes, in_suite.peak_bytes) == (alone.start_bytes, alone.peak_bytes)
    assert in_suite.extra["cuda_other_live_bytes"] == 3 << 20
    assert busy.devices[0].cached == 9000  # the cache was emptied at the start: only this step's blocks remain


def test_cuda_probe_collects_garbage_and_empties_the_cache_before_the_reset(monkeypatch):
    import gc

    cuda = FakeTorchCuda()
    order = []
    monkeypatch.setattr(gc, "collect", lambda *a: order.append("gc") or 0)
    real_reset = cuda.reset_peak_memory_stats
    cuda.empty_cache = lambda: order.append("empty_cache")
    cuda.reset_peak_memory_stats = lambda device=None: (order.append("reset"), real_reset(device))
    with CudaAllocatorProbe(cuda=cuda).track():
        pass
    assert order == ["gc", "empty_cache", "reset"]


def test_gc_at_the_start_frees_what_a_reference_cycle_holds():
    """Checkpointed graphs can leave reference cycles: without a collection their tensors are still allocated."""
    import gc

    cuda = FakeTorchCuda()

    class Holder:
        def __init__(self):
            self.handle = cuda.alloc(1 << 20)
            self.me = self  # a cycle: only the cycle collector frees it

        def __del__(self):
            cuda.free(self.handle)

    gc.disable()
    try:
        Holder()
        assert cuda.memory_allocated() == 1 << 20
        with CudaAllocatorProbe(cuda=cuda).track() as reading:
            pass
    finally:
        gc.enable()
    assert reading.extra["cuda_other_live_bytes"] == 0


def two_gpus_reordered():
    """torch sees physical GPUs 2 and 0 as cuda:0 and cuda:1 (CUDA_VISIBLE_DEVICES=2,0)."""
    uuids = ["00000000-aaaa-0000-0000-000000000000", "11111111-bbbb-0000-0000-000000000000", "22222222-cccc-0000-0000-000000000000"]
    cuda = FakeTorchCuda(uuids=[uuids[2], uuids[0]])
    physical = [cuda.devices[1], FakeCudaDevice(uuids[1], other_process_bytes=7 << 30), cuda.devices[0]]
    return cuda, FakeNVML(physical)


class Stepper:
    """Runs a scripted allocation pattern on a fake device while the sampler thread polls."""

    def __init__(self, cuda, device):
        self.cuda, self.device = cuda, device

    def step(self, sizes, hold_s=0.02):
        handles = []
        for n in sizes:
            handles.append(self.cuda.alloc(n, self.device))
            time.sleep(hold_s)
        for h in handles:
            self.cuda.free(h, self.device)


def test_nvml_probe_reads_the_gpu_torch_uses_by_uuid_not_by_index():
    cuda, nvml = two_gpus_reordered()
    device = torch.device("cuda", 0)  # physical GPU 2; NVML index 0 is another GPU, NVML index 1 a busy one
    probe = NvmlProbe(device, nvml=nvml, cuda=cuda, interval_s=0.0005)
    with probe.track() as reading:
        Stepper(cuda, 0).step([64 << 20])
    assert reading.extra["nvml_peak_used_bytes"] == cuda.devices[0].context_bytes + (64 << 20)
    assert reading.peak_bytes == 64 << 20
    assert nvml.initialised == 0
    with pytest.raises(RuntimeError, match="no NVML device has torch's UUID"):
        with NvmlProbe(device, nvml=FakeNVML([nvml.physical[1]]), cuda=cuda).track():
            pass


def test_nvml_probe_does_not_count_a_context_the_step_would_create_nor_earlier_cached_blocks():
    cuda = FakeTorchCuda()
    nvml = FakeNVML(cuda.devices)
    assert not cuda.is_initialized()
    probe = NvmlProbe(torch.device("cuda", 0), nvml=nvml, cuda=cuda, interval_s=0.0005)
    with probe.track(resident=[]) as first:
        Stepper(cuda, 0).step([32 << 20, 32 << 20])
    assert first.extra["nvml_context_created_by_probe"] == 1
    assert first.extra["nvml_context_bytes"] == cuda.devices[0].context_bytes
    assert first.peak_bytes == 64 << 20  # the step's memory only, context reported apart
    # the 64 MiB of the first step stay cached in the allocator; a second run starts fresh all the same
    assert cuda.memory_reserved(0) == 64 << 20
    with probe.track() as second:
        Stepper(cuda, 0).step([32 << 20, 32 << 20])
    assert second.peak_bytes == first.peak_bytes
    assert second.extra["nvml_context_created_by_probe"] == 0
    assert not second.exact and second.extra["nvml_memory_api"] == "v2"


def test_nvml_probe_falls_back_to_v1_when_driver_lacks_v2():
    cuda = FakeTorchCuda()
    nvml = FakeNVML(cuda.devices, support_v2=False)
    with NvmlProbe(nvml=nvml, cuda=cuda).track() as reading:
        pass
    assert reading.extra["nvml_memory_api"] == "v1"
    assert reading.peak_bytes == 0 and reading.extra["nvml_context_bytes"] == cuda.devices[0].context_bytes


def test_uuid_forms_are_normalised():
    assert normalise_uuid(b"GPU-2C2D") == normalise_uuid("gpu-2c2d") == normalise_uuid("2c2d") == "2c2d"


def test_sampler_failure_surfaces():
    cuda = FakeTorchCuda()
    nvml = FakeNVML(cuda.devices)
    calls = {"n": 0}
    real = nvml.nvmlDeviceGetMemoryInfo

    def flaky(handle, version=None):
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("GPU fell off the bus")
        return real(handle, version)

    nvml.nvmlDeviceGetMemoryInfo = flaky
    with pytest.raises(RuntimeError, match="memory sampler failed: GPU fell off the bus"):
        with NvmlProbe(nvml=nvml, cuda=cuda, interval_s=0.0005).track():
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
    assert cuda_reading.peak_bytes >= 256 * 2**20
    assert nvml_reading.peak_bytes >= 256 * 2**20 * 0.9
    assert nvml_reading.extra["nvml_context_bytes"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; this machine has none")
def test_real_nvml_device_is_the_one_torch_uses():
    import pynvml

    from pytest_flashckpt.probes.nvml import nvml_handle_for

    pynvml.nvmlInit()
    try:
        for index in range(torch.cuda.device_count()):
            uuid = str(torch.cuda.get_device_properties(index).uuid)
            handle = nvml_handle_for(pynvml, uuid)
            assert normalise_uuid(pynvml.nvmlDeviceGetUUID(handle)) == normalise_uuid(uuid)
            assert pynvml.nvmlDeviceGetName(handle)
    finally:
        pynvml.nvmlShutdown()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; this machine has none")
def test_real_cuda_probe_ignores_other_live_tensors():
    device = torch.device("cuda:0")
    weights = torch.empty(8 * 2**20, dtype=torch.uint8, device=device)

    def step():
        tmp = torch.empty(32 * 2**20, dtype=torch.uint8, device=device)
        del tmp

    with make_probe("cuda", device).track(resident=[weights]) as alone:
        step()
    other = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)  # another scenario's trainer
    with make_probe("cuda", device).track(resident=[weights]) as busy:
        step()
    del other
    assert alone.peak_bytes == busy.peak_bytes == 40 * 2**20
    assert alone.start_bytes == busy.start_bytes == 8 * 2**20
