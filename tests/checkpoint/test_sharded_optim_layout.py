"""Sharded saves flatten the optimizer state (``sharded_store.SAVE_OPTIONS``: one key per parameter and setting,
what lets pipeline stages write one checkpoint), and ``train_state.json`` says so; a sharded checkpoint written
before, with torch's nested optimizer state and no ``optim_layout``, still loads bit for bit. One process (a
one-rank group), ~1 s."""

from __future__ import annotations

import json

from ckpt_helpers import make_trainer
from pytest_flashckpt.checkpoint import dcp_io
from pytest_flashckpt.distributed import sharded_store


def _saved_and_loaded(tmp_path, monkeypatch=None):
    trainer = make_trainer()
    for _ in range(2):
        trainer.train_step()
    with dcp_io.process_group():
        with sharded_store.ShardedCheckpointer(tmp_path / "root") as ckpt:
            folder = ckpt.save(trainer).folder
        want = sharded_store.local_full_state(trainer)
    if monkeypatch is not None:
        monkeypatch.undo()  # the load runs today's code
    fresh = make_trainer()
    sharded_store.load_plain(fresh, folder)
    with dcp_io.process_group():
        got = sharded_store.local_full_state(fresh)
    return folder, want, got, fresh


def test_a_sharded_save_flattens_the_optimizer_state_and_loads_back_bitwise(tmp_path) -> None:
    folder, want, got, fresh = _saved_and_loaded(tmp_path)
    assert json.loads((folder / sharded_store.TRAIN_STATE).read_text())["optim_layout"] == "flat"
    assert any(key.startswith("optim/state.") for key in want)  # control: the flat keys are what was compared
    assert sharded_store.bitwise_differences(got, want) == [] and fresh.step == 2


def test_a_nested_checkpoint_written_before_the_flat_layout_still_loads_bitwise(tmp_path, monkeypatch) -> None:
    written = sharded_store._train_state
    monkeypatch.setattr(sharded_store, "SAVE_OPTIONS", None)  # torch's nested optimizer state, as saves were
    monkeypatch.setattr(sharded_store, "_train_state", lambda *a: {k: v for k, v in written(*a).items() if k != "optim_layout"})
    folder, want, got, fresh = _saved_and_loaded(tmp_path, monkeypatch)
    assert "optim_layout" not in json.loads((folder / sharded_store.TRAIN_STATE).read_text())
    assert sharded_store.bitwise_differences(got, want) == [] and fresh.step == 2
