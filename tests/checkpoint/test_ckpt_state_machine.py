"""A differential state machine: train, save with any strategy, restore, rotate, corrupt, resume.

Invariant: whatever restores equals, bit for bit, a shadow copy of the training state taken when it was saved; a
damaged checkpoint (or one whose base is damaged) never restores; resume picks the newest undamaged one and warns
exactly when it had to skip one; ``latest`` always names an existing folder.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ckpt_helpers import CONFIGS, assert_same_state, make_trainer, snapshot
from pytest_flashckpt.checkpoint import CheckpointError, CheckpointFallbackWarning, Checkpointer, CorruptCheckpointError, load_into, resume_latest
from pytest_flashckpt.checkpoint.manifest import read_manifest
from pytest_flashckpt.checkpoint.rotation import rotate

NAMES = ["sync-torch", "sync-safetensors", "async-torch", "async-safetensors", "dcp", "dcp-async", "selective-trainable", "layerwise-safetensors", "scheduled"]


class CheckpointMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="flashckpt-sm-"))
        self.trainer = make_trainer(freeze_embeddings=True)  # frozen embeddings: selective restores are exact too
        self.ckpts: dict[str, Checkpointer] = {}
        self.shadows: dict[Path, dict] = {}
        self.bases: dict[Path, Path | None] = {}
        self.damaged: set[Path] = set()

    def _ckpt(self, name: str) -> Checkpointer:
        if name not in self.ckpts:
            self.ckpts[name] = Checkpointer(self.dir / name, dataclasses.replace(CONFIGS[name], max_keep=3))
        return self.ckpts[name]

    def _settle(self) -> list[Path]:
        for ckpt in self.ckpts.values():
            ckpt.wait()
        for folder in [f for f in self.shadows if not f.is_dir()]:
            del self.shadows[folder]
        return sorted(self.shadows)

    def _restorable(self, folder: Path) -> bool:
        base = self.bases[folder]
        return folder not in self.damaged and (base is None or (base not in self.damaged and base.is_dir()))

    @rule(steps=st.integers(1, 2))
    def train(self, steps: int) -> None:
        for _ in range(steps):
            self.trainer.train_step()

    @rule(name=st.sampled_from(NAMES))
    def save(self, name: str) -> None:
        ckpt = self._ckpt(name)
        record = ckpt.save(self.trainer)
        folder = ckpt.store.root / record.name
        self.shadows[folder] = snapshot(self.trainer)
        self.bases[folder] = ckpt.store.root / record.base if record.base else None

    @precondition(lambda self: self.shadows)
    @rule(data=st.data())
    def restore(self, data) -> None:
        folders = self._settle()
        if not folders:
            return
        folder = data.draw(st.sampled_from(folders))
        fresh = make_trainer(init_seed=11, freeze_embeddings=True)
        if self._restorable(folder):
            load_into(fresh, folder)
            assert_same_state(snapshot(fresh), self.shadows[folder])
        else:
            with pytest.raises(CorruptCheckpointError):
                load_into(fresh, folder)

    @precondition(lambda self: self.ckpts)
    @rule(data=st.data(), keep=st.integers(1, 2))
    def rotate_now(self, data, keep: int) -> None:
        self._settle()
        name = data.draw(st.sampled_from(sorted(self.ckpts)))
        store = self.ckpts[name].store
        newest = store.complete()[-1] if store.complete() else None
        rotate(store, keep)
        assert newest is None or newest.is_dir()

    @precondition(lambda self: self.shadows)
    @rule(data=st.data())
    def corrupt(self, data) -> None:
        folders = [f for f in self._settle() if f not in self.damaged]  # a second flip could undo the first
        if not folders:
            return
        folder = data.draw(st.sampled_from(folders))
        files = sorted(read_manifest(folder).files)
        target = folder / data.draw(st.sampled_from(files))
        raw = bytearray(target.read_bytes())
        if not raw:
            target.write_bytes(b"x")
        elif data.draw(st.booleans()):
            os.truncate(target, data.draw(st.integers(0, len(raw) - 1)))
        else:
            index = data.draw(st.integers(0, len(raw) - 1))
            raw[index] ^= 0x5A
            target.write_bytes(bytes(raw))
        self.damaged.add(folder)

    @precondition(lambda self: self.ckpts)
    @rule(data=st.data())
    def resume(self, data) -> None:
        self._settle()
        name = data.draw(st.sampled_from(sorted(self.ckpts)))
        store = self.ckpts[name].store
        latest = store.latest_name()
        candidates = ([store.root / latest] if latest else []) + [p for p in reversed(store.complete()) if p.name != latest]
        good = [p for p in candidates if self._restorable(p)]
        fresh = make_trainer(init_seed=12, freeze_embeddings=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if not good:
                with pytest.raises(CheckpointError):
                    resume_latest(fresh, store.root)
                return
            loaded = resume_latest(fresh, store.root)
        assert loaded is not None and loaded.folder == good[0]
        fallbacks = [w for w in caught if issubclass(w.category, CheckpointFallbackWarning)]
        assert len(fallbacks) == (good[0] != candidates[0]) and len(caught) == len(fallbacks)
        assert_same_state(snapshot(fresh), self.shadows[good[0]])

    @invariant()
    def latest_names_an_existing_checkpoint(self) -> None:
        for ckpt in self.ckpts.values():
            ckpt.wait()
            latest = ckpt.store.latest_name()
            assert latest is None or (ckpt.store.root / latest / "manifest.json").is_file()

    def teardown(self) -> None:
        try:
            for ckpt in self.ckpts.values():
                ckpt.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


CheckpointMachine.TestCase.settings = settings(settings(), stateful_step_count=15)
TestCheckpointMachine = CheckpointMachine.TestCase
