"""The checkpoint pass's GPU paths, proved here with fakes that model the real APIs, and on CUDA where present:
verification compares on one device, the copy bound is a pinned device-to-host copy on the state's device, the
staging area synchronises the device its copies were issued on, and host staging is not counted as device memory."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ckpt_helpers import make_trainer
from pytest_flashckpt.checkpoint import bandwidth, run_checkpoint_pass
from pytest_flashckpt.checkpoint.measure import differing_keys
from pytest_flashckpt.checkpoint.staging import StagingArea
from pytest_flashckpt.checkpoint.state import CapturedState
from pytest_flashckpt.config.scenario import SaveConfig

class OnDevice:
    """A GPU tensor as far as comparison goes: ``torch.equal`` refuses it next to a CPU tensor (as with a real
    CUDA tensor: 'Expected all tensors to be on the same device'); ``.cpu()`` gives its values."""

    def __init__(self, values: torch.Tensor) -> None:
        self.values = values
        self.device = torch.device("cuda", 1)

    def detach(self) -> "OnDevice":
        return self

    def cpu(self) -> torch.Tensor:
        return self.values.clone()


def test_verification_compares_device_state_with_cpu_loaded_tensors_on_the_cpu():
    expected = {"a": OnDevice(torch.arange(4.0)), "b": OnDevice(torch.ones(2))}
    loaded = {"a": torch.arange(4.0), "b": torch.zeros(2)}
    with pytest.raises(TypeError):
        torch.equal(loaded["a"], expected["a"])  # what the old comparison did with a device tensor
    assert differing_keys(loaded, expected) == ["b"]


def test_copy_bound_on_a_gpu_times_a_pinned_device_to_host_copy_on_that_device(monkeypatch):
    synced, copies = [], []
    real_copy = torch.Tensor.copy_

    def spy(dst, src, non_blocking=False):
        copies.append((src.device, dst.device, dst.is_pinned() if dst.device.type == "cpu" else None, non_blocking))
        return real_copy(dst, src, non_blocking)

    monkeypatch.setattr(torch.Tensor, "copy_", spy)
    with FakeTensorMode(allow_non_fake_inputs=True):  # cuda tensors without a GPU; pinned buffer requested
        gbps = bandwidth.copy_bandwidth_GBps(megabytes=1, repeats=2, device=torch.device("cuda:1"), synchronize=synced.append)
    assert gbps > 0
    assert synced == [torch.device("cuda:1")] * 3
    assert {c[0] for c in copies} == {torch.device("cuda:1")} and {c[1].type for c in copies} == {"cpu"}
    assert all(c[3] for c in copies)


def test_copy_bound_on_a_cpu_is_a_host_copy():
    assert bandwidth.copy_bandwidth_GBps(megabytes=1, repeats=1, device=torch.device("cpu")) > 0


def test_staging_synchronises_the_device_of_the_tensors_not_the_current_one(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with FakeTensorMode(allow_non_fake_inputs=True):
        tensors = {"w": torch.ones(8, device="cuda:1"), "m": torch.ones(8, device="cuda:1")}
        staged = StagingArea().snapshot(tensors)
    assert synced == [torch.device("cuda:1")]
    assert {t.device.type for t in staged.values()} == {"cpu"}


def test_captured_state_knows_when_it_lives_on_a_gpu():
    with FakeTensorMode(allow_non_fake_inputs=True):
        gpu = CapturedState({"w": torch.ones(2, device="cuda:0")}, {})
    assert gpu.on_device and not CapturedState({"w": torch.ones(2)}, {}).on_device


@pytest.mark.usefixtures("small_bandwidth_probes")
def test_cpu_async_save_still_counts_staging_in_extra_peak_and_reports_no_host_split(tmp_path):
    metrics = run_checkpoint_pass(make_trainer(), SaveConfig(async_save=True, saves=2), tmp_path)
    assert metrics["save_extra_peak_bytes"] >= metrics["snapshot_bytes"]
    assert "save_staging_host_bytes" not in metrics


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; this machine has none")
@pytest.mark.parametrize("config", [SaveConfig(strategy="sync", saves=2), SaveConfig(async_save=True, saves=2)], ids=["sync", "async"])
@pytest.mark.parametrize("index", [0, 1])
def test_gpu_checkpoint_pass_verifies_and_splits_host_and_device_bytes(config, index, tmp_path):
    if index >= torch.cuda.device_count():
        pytest.skip(f"needs {index + 1} CUDA devices")
    from pytest_flashckpt.models import GPTConfig, build_model
    from pytest_flashckpt.training import Trainer

    device = torch.device("cuda", index)
    model = build_model(GPTConfig(vocab_size=256, block_size=128, n_layer=2, n_head=2, n_embd=64), "sdpa", device, torch.bfloat16)
    metrics = run_checkpoint_pass(Trainer.create(model, 2, 64), config, tmp_path, probe_name="cuda")
    assert metrics["verified"] == "bitwise"
    assert metrics["save_extra_peak_bytes"] < metrics["snapshot_bytes"] or not config.async_save
    if config.async_save:
        assert metrics["save_staging_host_bytes"] >= metrics["snapshot_bytes"]
    assert metrics["copy_GBps"] > 0

