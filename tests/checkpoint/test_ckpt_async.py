"""Asynchronous saves: snapshot isolation, one save in flight, failures surface, rotation while in flight."""

from __future__ import annotations

import errno
import threading

import pytest
import torch

from ckpt_helpers import assert_same_state, make_trainer, snapshot
from pytest_flashckpt.checkpoint import CheckpointError, Checkpointer, formats, load_into, read_checkpoint
from pytest_flashckpt.config.scenario import SaveConfig


class GatedWriter:
    """Replaces the tensor-file writer: blocks each write until released, so a save stays in flight."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self._real = formats.write_tensor_file
        monkeypatch.setattr(formats, "write_tensor_file", self)

    def __call__(self, path, tensors, fmt) -> None:
        self.started.set()
        assert self.release.wait(30), "test never released the writer"
        self._real(path, tensors, fmt)


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_later_training_never_leaks_into_the_snapshot(fmt: str, tmp_path, monkeypatch) -> None:
    trainer = make_trainer()
    trainer.train_step()
    gate = GatedWriter(monkeypatch)
    ckpt = Checkpointer(tmp_path, SaveConfig(async_save=True, format=fmt))
    record = ckpt.save(trainer)
    expected = snapshot(trainer)
    assert gate.started.wait(30)
    for _ in range(2):  # the live model and optimizer change while the write is blocked
        trainer.train_step()
    with torch.no_grad():
        trainer.model.wte.weight.add_(1.0)
    gate.release.set()
    ckpt.close()
    fresh = make_trainer(init_seed=4)
    load_into(fresh, tmp_path / record.name)
    assert_same_state(snapshot(fresh), expected, skip_prefix=("rng/",))


def test_one_save_in_flight_and_staging_is_reused(tmp_path, monkeypatch) -> None:
    trainer = make_trainer()
    trainer.train_step()
    gate = GatedWriter(monkeypatch)
    ckpt = Checkpointer(tmp_path, SaveConfig(async_save=True))
    ckpt.save(trainer)
    assert gate.started.wait(30)
    trainer.train_step()
    second = threading.Thread(target=ckpt.save, args=(trainer,))
    second.start()
    second.join(0.3)
    assert second.is_alive(), "a second save must wait for the one in flight"
    gate.release.set()
    second.join(30)
    ckpt.close()
    assert len(ckpt.store.complete()) == 2
    assert ckpt.staging.allocations == len(read_checkpoint(ckpt.store.complete()[-1]).tensors)
    assert ckpt.records[1].wait_s > 0.2


def test_background_failure_surfaces_on_next_call_and_close(tmp_path, monkeypatch) -> None:
    trainer = make_trainer()
    trainer.train_step()

    def disk_full(path, tensors, fmt):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(formats, "write_tensor_file", disk_full)
    ckpt = Checkpointer(tmp_path, SaveConfig(async_save=True))
    ckpt.save(trainer)
    with pytest.raises(CheckpointError, match="no space left"):
        ckpt.save(trainer)  # the next call raises the first save's failure
    ckpt.save(trainer)
    with pytest.raises(CheckpointError, match="background checkpoint save failed"):
        ckpt.close()
    assert ckpt.store.complete() == []
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_rotation_keeps_the_newest_complete_while_a_save_is_in_flight(tmp_path, monkeypatch) -> None:
    trainer = make_trainer()
    ckpt = Checkpointer(tmp_path, SaveConfig(async_save=True, max_keep=1))
    for _ in range(2):
        trainer.train_step()
        ckpt.save(trainer)
    ckpt.wait()
    newest = ckpt.store.complete()[-1]
    gate = GatedWriter(monkeypatch)
    trainer.train_step()
    ckpt.save(trainer)
    assert gate.started.wait(30)
    assert ckpt.store.complete() == [newest] and ckpt.store.latest_name() == newest.name
    load_into(make_trainer(init_seed=5), newest)
    gate.release.set()
    ckpt.close()
    assert [p.name for p in ckpt.store.complete()] == [ckpt.records[-1].name]
