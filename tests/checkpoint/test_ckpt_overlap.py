"""Overlapped staging: the save call returns at once, the copy runs during the next forward/backward, the optimizer
step waits for it, and what is written equals the state at the save call bit for bit, whatever happens in between."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from ckpt_helpers import make_trainer
from pytest_flashckpt.checkpoint import CheckpointError, Checkpointer, read_checkpoint
from pytest_flashckpt.checkpoint import staging as staging_mod
from pytest_flashckpt.checkpoint.state import capture
from pytest_flashckpt.config.scenario import SaveConfig

OVERLAPPED = SaveConfig(strategy="async", staging="overlapped")


def shadow(trainer) -> dict:
    state = capture(trainer)
    return {"tensors": {k: t.clone() for k, t in state.tensors.items()}, "tree": state.tree}


def assert_written_equals(folder: Path, expected: dict) -> None:
    loaded = read_checkpoint(folder)
    assert sorted(loaded.tensors) == sorted(expected["tensors"])
    for key, want in expected["tensors"].items():
        got = loaded.tensors[key]
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), key
    assert loaded.meta["tree"] == expected["tree"]


class Gate:
    """Staging hook that blocks the copy before tensor number ``at`` until released."""

    def __init__(self, at: int = 0) -> None:
        self.at, self.seen = at, 0
        self.reached, self.release = threading.Event(), threading.Event()

    def __call__(self, key: str) -> None:
        if self.seen == self.at:
            self.reached.set()
            assert self.release.wait(30), "test never released the copy"
        self.seen += 1


def test_config_rejects_overlapped_staging_where_it_cannot_overlap() -> None:
    with pytest.raises(ValueError, match="staging: overlapped .* valid stagings for layout dcp: blocking, background"):
        SaveConfig(strategy="dcp", staging="overlapped")
    assert SaveConfig(staging="overlapped").strategy == "async"  # the seed's name for it
    layerwise = SaveConfig(strategy="layerwise", staging="overlapped")  # an axis: any file layout can overlap its copy
    assert (layerwise.strategy, layerwise.axes.layout, layerwise.axes.staging) == ("layerwise", "layerwise", "overlapped")


def test_save_returns_before_the_copy_and_the_optimizer_step_waits(tmp_path) -> None:
    trainer = make_trainer()
    trainer.train_step()
    ckpt = Checkpointer(tmp_path, OVERLAPPED)
    gate = Gate(at=0)
    ckpt.staging.on_copy = gate
    expected = shadow(trainer)
    record = ckpt.save(trainer)  # returns although no tensor is copied yet
    assert gate.reached.wait(30) and not record.done
    stepper = threading.Thread(target=trainer.train_step)
    stepper.start()
    stepper.join(0.3)
    assert stepper.is_alive(), "optimizer.step() must wait for the copy"
    live = capture(trainer).tensors
    assert all(torch.equal(live[k], expected["tensors"][k]) for k in expected["tensors"] if k.startswith("model/"))
    gate.release.set()
    stepper.join(30)
    ckpt.close()
    assert record.fence_wait_s >= 0.2 and record.save_stall_s >= record.fence_wait_s
    assert_written_equals(tmp_path / record.name, expected)


def test_a_slowed_copy_makes_the_optimizer_step_wait_and_is_still_exact(tmp_path) -> None:
    trainer = make_trainer()
    trainer.train_step()
    ckpt = Checkpointer(tmp_path, OVERLAPPED)
    ckpt.staging.on_copy = lambda key: time.sleep(0.005)  # ~50 tensors: the copy outlasts a tiny step's forward/backward
    expected = shadow(trainer)
    record = ckpt.save(trainer)
    trainer.train_step()
    ckpt.close()
    assert record.fence_wait_s > 0
    assert_written_equals(tmp_path / record.name, expected)


def test_fence_on_a_tensor_waits_for_its_prefix_only(tmp_path) -> None:
    trainer = make_trainer()
    trainer.train_step()
    ckpt = Checkpointer(tmp_path, OVERLAPPED)
    gate = Gate(at=2)
    ckpt.staging.on_copy = gate
    expected = shadow(trainer)
    record = ckpt.save(trainer)
    first = capture(trainer).tensors["model/wte.weight"]
    ckpt.fence(first)  # returns while the copy is blocked before the third tensor
    copy = ckpt._pending.copy
    assert gate.reached.wait(30) and copy.order["model/wte.weight"] < copy.copied < len(copy.keys)
    with torch.no_grad():
        first.add_(1.0)  # allowed: it is staged
    gate.release.set()
    ckpt.close()
    assert_written_equals(tmp_path / record.name, expected)


def test_an_unfenced_in_place_change_fails_the_save_instead_of_writing_a_torn_snapshot(tmp_path) -> None:
    trainer = make_trainer()
    trainer.train_step()
    ckpt = Checkpointer(tmp_path, OVERLAPPED)
    gate = Gate(at=0)
    ckpt.staging.on_copy = gate
    ckpt.save(trainer)
    assert gate.reached.wait(30)
    with torch.no_grad():
        list(trainer.model.parameters())[-1].mul_(2.0)
    gate.release.set()
    with pytest.raises(CheckpointError, match="changed in place"):
        ckpt.close()
    assert ckpt.store.complete() == []


def test_scalars_are_captured_at_the_save_call_without_a_fence(tmp_path) -> None:
    trainer = make_trainer()
    trainer.train_step()
    ckpt = Checkpointer(tmp_path, OVERLAPPED)
    gate = Gate(at=0)
    ckpt.staging.on_copy = gate
    expected = shadow(trainer)
    record = ckpt.save(trainer)
    assert gate.reached.wait(30)
    step_counter = next(iter(trainer.optimizer.state.values()))["step"]  # a 0-dim tensor, like a tensor LR
    step_counter.add_(100)
    gate.release.set()
    ckpt.close()
    assert_written_equals(tmp_path / record.name, expected)


def test_staging_buffers_are_reused_across_overlapped_saves(tmp_path) -> None:
    trainer = make_trainer()
    with Checkpointer(tmp_path, OVERLAPPED) as ckpt:
        for _ in range(3):
            trainer.train_step()
            ckpt.save(trainer)
        n = len(capture(trainer).tensors)
    assert ckpt.staging.allocations == n


class OverlapMachine(RuleBasedStateMachine):
    """Steps, saves and in-place changes interleaved at random while copies are in flight (slowed at random);
    every committed checkpoint must equal, bit for bit, the state at its save call."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="flashckpt-overlap-"))
        self.trainer = make_trainer()
        self.trainer.train_step()
        self.ckpt = Checkpointer(self.dir, OVERLAPPED)
        self.delay = 0.0
        self.ckpt.staging.on_copy = lambda key: time.sleep(self.delay) if self.delay else None
        self.shadows: dict[str, dict] = {}

    @rule(delay=st.sampled_from([0.0, 0.0005, 0.002]))
    def save(self, delay: float) -> None:  # a save while another is in flight waits for it first
        self.delay = delay
        expected = shadow(self.trainer)
        record = self.ckpt.save(self.trainer)
        self.shadows[record.name] = expected

    @rule()
    def forward_backward(self) -> None:
        x, y = self.trainer.batch()
        self.trainer.model(x, y).backward()

    @rule()
    def optimizer_step(self) -> None:  # fenced by the checkpointer's step pre-hook
        self.trainer.optimizer.step()

    @rule()
    def scheduler_step(self) -> None:
        self.trainer.scheduler.step()

    @rule(to_none=st.booleans())
    def zero_grad(self, to_none: bool) -> None:
        self.trainer.optimizer.zero_grad(set_to_none=to_none)

    @rule()
    def train_step(self) -> None:
        self.trainer.train_step()

    @rule(index=st.integers(0, 100), value=st.floats(-2, 2, allow_nan=False))
    def edit_param_in_place(self, index: int, value: float) -> None:
        params = list(self.trainer.model.parameters())
        p = params[index % len(params)]
        self.ckpt.fence(p)  # the contract for in-place changes outside optimizer.step()
        with torch.no_grad():
            p.add_(value)

    @rule()
    def settle(self) -> None:
        self.ckpt.wait()

    @invariant()
    def committed_checkpoints_equal_their_save_call(self) -> None:
        for folder in self.ckpt.store.complete():
            if folder.name in self.shadows:
                assert_written_equals(folder, self.shadows.pop(folder.name))

    def teardown(self) -> None:
        try:
            self.ckpt.close()
            self.committed_checkpoints_equal_their_save_call()
            assert not self.shadows, f"saves never committed: {sorted(self.shadows)}"
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


TestOverlapMachine = OverlapMachine.TestCase
TestOverlapMachine.settings = settings(settings.default, stateful_step_count=12)  # examples: the profile's (conftest)


# -- the GPU path: its ordering logic against a fake of torch.cuda's stream/event API, and on a real device -------
class FakeCuda:
    """Records stream/event calls; copies run synchronously on CPU tensors (the device is not needed for ordering)."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        outer = self

        class Event:
            def __init__(self) -> None:
                self.id = len([e for e in outer.log if e[0] == "record"])

            def record(self, stream) -> None:
                outer.log.append(("record", stream.name, self.id))

            def synchronize(self) -> None:
                outer.log.append(("synchronize", self.id))

        class Stream:
            def __init__(self, name: str = "side") -> None:
                self.name = name

            def wait_stream(self, other) -> None:
                outer.log.append(("wait_stream", self.name, other.name))

            def wait_event(self, event) -> None:
                outer.log.append(("wait_event", self.name, event.id))

        self.Event, self.Stream = Event, Stream
        self.compute = Stream("compute")

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "Event", self.Event)
        monkeypatch.setattr(torch.cuda, "Stream", self.Stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: self.compute)
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())


def test_cuda_copy_orders_side_stream_after_compute_and_fences_on_the_needed_event(monkeypatch) -> None:
    fake = FakeCuda()
    fake.install(monkeypatch)
    src = {f"t{i}": torch.full((3,), float(i)) for i in range(4)}
    staged = {k: torch.zeros(3) for k in src}
    copy = staging_mod.CudaStagedCopy(src, staged)
    assert fake.log[0] == ("wait_stream", "side", "compute")  # the copy sees the state as of the save call
    assert [e for e in fake.log if e[0] == "record"] == [("record", "side", i) for i in range(4)]
    assert copy.fence(["t1"]) == 0.0  # the host does not block
    assert fake.log[-1] == ("wait_event", "compute", 1)  # the compute stream waits for t0..t1 only
    copy.fence()
    assert fake.log[-1] == ("wait_event", "compute", 3)
    out = copy.result()
    assert fake.log[-1] == ("synchronize", 3)
    assert all(torch.equal(out[k], src[k]) for k in src)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_overlapped_save_is_exact(tmp_path) -> None:
    from pytest_flashckpt.models import build_model
    from pytest_flashckpt.training import Trainer

    from ckpt_helpers import TINY

    trainer = Trainer.create(build_model(TINY, "sdpa", seed=0).cuda(), batch_size=2, seq_len=16)
    trainer.train_step()
    ckpt = Checkpointer(tmp_path, OVERLAPPED)
    expected = {k: v.cpu() for k, v in shadow(trainer)["tensors"].items()}
    record = ckpt.save(trainer)
    for _ in range(2):
        trainer.train_step()
    ckpt.close()
    loaded = read_checkpoint(tmp_path / record.name)
    assert all(torch.equal(loaded.tensors[k].cpu(), v) for k, v in expected.items())


def test_every_axis_value_has_an_implementation() -> None:
    from typing import get_args

    from pytest_flashckpt.checkpoint.layouts import LAYOUTS
    from pytest_flashckpt.config.scenario import SaveLayout, SaveSchedule, SaveStaging
    from pytest_flashckpt.core.registry import SAVE_LAYOUTS, SAVE_PRESETS, SAVE_SCHEDULES, SAVE_STAGINGS

    assert sorted(LAYOUTS) == sorted(SAVE_LAYOUTS) == sorted(get_args(SaveLayout))
    assert sorted(get_args(SaveStaging)) == sorted(SAVE_STAGINGS) and sorted(get_args(SaveSchedule)) == sorted(SAVE_SCHEDULES)
    for preset in SAVE_PRESETS.values():
        assert (preset.layout in SAVE_LAYOUTS and preset.staging in SAVE_STAGINGS and preset.schedule in SAVE_SCHEDULES
                and preset.description), preset
