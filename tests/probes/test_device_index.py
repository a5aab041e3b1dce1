"""``cuda:N`` with N != 0: timing events, the save scheduler's memory gauge and the device resolution act on the
scenario's GPU, not on the current one (cuda:0). Proved with fakes of ``torch.cuda`` and on CUDA where present."""

from __future__ import annotations

import pytest
import torch

from cuda_fakes import FakeTorchCuda
from pytest_flashckpt.checkpoint.scheduling import memory_gauge, process_memory
from pytest_flashckpt.runner import timing


class FakeEvent:
    log: list = []
    cuda: FakeTorchCuda

    def __init__(self, enable_timing=False):
        self.made_on = FakeEvent.cuda.current

    def record(self, stream=None):
        FakeEvent.log.append(("record", self.made_on, FakeEvent.cuda.current))

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return 2.0


def test_timing_events_are_made_and_recorded_on_the_scenarios_device(monkeypatch):
    cuda = FakeTorchCuda(uuids=("a", "b"))
    FakeEvent.cuda, FakeEvent.log = cuda, []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "device", cuda.device)
    monkeypatch.setattr(torch.cuda, "synchronize", cuda.synchronize)
    seen = []
    mean = timing.time_steps(lambda: seen.append(cuda.current), 2, torch.device("cuda:1"))
    assert mean == pytest.approx(0.001)
    assert FakeEvent.log == [("record", 1, 1), ("record", 1, 1)]
    assert seen == [1, 1] and cuda.current == 0  # the previous device is current again afterwards
    assert ("synchronize", 1) in cuda.calls


def test_memory_gauge_reads_the_scenarios_gpu():
    cuda = FakeTorchCuda(uuids=("a", "b"))
    cuda.alloc(3 << 30, device=1)
    assert memory_gauge(torch.device("cuda:1"), cuda=cuda)() == (3 << 30, 80 * 2**30)
    assert memory_gauge(torch.device("cuda:0"), cuda=cuda)()[0] == 0
    assert memory_gauge(torch.device("cpu")) is process_memory


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices; this machine has fewer")
def test_real_events_and_gauge_on_the_second_gpu():
    device = torch.device("cuda:1")
    x = torch.randn(1024, 1024, device=device)
    assert timing.time_steps(lambda: x @ x, 3, device) > 0
    used, capacity = memory_gauge(device)()
    assert used >= x.numel() * 4 and capacity == torch.cuda.get_device_properties(1).total_memory


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; this machine has none")
def test_real_cuda_device_resolves_to_an_explicit_index():
    from pytest_flashckpt.runner.context import resolve_device

    assert resolve_device("cuda").index == torch.cuda.current_device()
    assert resolve_device("auto").index == 0
    with pytest.raises(ValueError, match="CUDA device"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")
