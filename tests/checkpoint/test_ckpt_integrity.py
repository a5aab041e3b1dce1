"""Verified loads: corrupt, truncated, partial and malicious checkpoints; disk full and permission denied mid-save."""

from __future__ import annotations

import errno
import json
import os
import pathlib

import pytest
import torch

from ckpt_helpers import make_trainer
from pytest_flashckpt.checkpoint import (
    CheckpointError,
    CheckpointFallbackWarning,
    Checkpointer,
    CorruptCheckpointError,
    formats,
    load_into,
    resume_latest,
    store as store_module,
)
from pytest_flashckpt.checkpoint.manifest import MANIFEST, sha256_file
from pytest_flashckpt.config.scenario import SaveConfig


def two_checkpoints(root: pathlib.Path, config: SaveConfig = SaveConfig(strategy="sync")) -> tuple[pathlib.Path, pathlib.Path]:
    trainer = make_trainer()
    with Checkpointer(root, config) as ckpt:
        trainer.train_step()
        older = ckpt.save(trainer)
        trainer.train_step()
        newer = ckpt.save(trainer)
    return root / older.name, root / newer.name


def flip_byte(path: pathlib.Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda f: flip_byte(f / "state.safetensors", 5000), "state.safetensors: sha256 does not match"),
        (lambda f: os.truncate(f / "state.safetensors", 100), "state.safetensors: 100 bytes"),
        (lambda f: (f / "meta.json").unlink(), "meta.json: missing"),
        (lambda f: (f / MANIFEST).unlink(), "manifest.json: missing"),
        (lambda f: (f / MANIFEST).write_text("{not json"), "unreadable manifest"),
    ],
    ids=["flipped-byte", "truncated", "missing-file", "no-manifest", "bad-manifest"],
)
def test_damage_is_an_error_naming_the_file_and_resume_falls_back(damage, message, tmp_path) -> None:
    older, newer = two_checkpoints(tmp_path, SaveConfig(strategy="sync", format="safetensors"))
    damage(newer)
    with pytest.raises(CorruptCheckpointError, match=message):
        load_into(make_trainer(), newer)
    fresh = make_trainer(init_seed=9)
    with pytest.warns(CheckpointFallbackWarning, match=newer.name):
        loaded = resume_latest(fresh, tmp_path)
    assert loaded is not None and loaded.folder == older and fresh.step == 1


def test_no_valid_checkpoint_is_an_error(tmp_path) -> None:
    older, newer = two_checkpoints(tmp_path)
    for folder in (older, newer):
        flip_byte(folder / "state.pt", 200)
    with pytest.raises(CheckpointError, match="no valid checkpoint"):
        resume_latest(make_trainer(), tmp_path)
    assert resume_latest(make_trainer(), tmp_path / "empty") is None


class Evil:
    """Unpickling this would create a marker file."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path) -> None:
    older, newer = two_checkpoints(tmp_path)
    marker = tmp_path / "pwned"
    torch.save({"model/wte.weight": Evil(marker)}, newer / "state.pt")
    manifest = json.loads((newer / MANIFEST).read_text())  # an attacker can rewrite the checksums too
    manifest["files"]["state.pt"] = {"bytes": (newer / "state.pt").stat().st_size, "sha256": sha256_file(newer / "state.pt")}
    (newer / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CorruptCheckpointError, match="state.pt: refused by torch.load"):
        load_into(make_trainer(), newer)
    with pytest.warns(CheckpointFallbackWarning):
        assert resume_latest(make_trainer(), tmp_path).folder == older
    assert not marker.exists()


def test_leftover_temporary_folders_are_ignored_and_cleaned(tmp_path) -> None:
    older, newer = two_checkpoints(tmp_path)
    crash = tmp_path / ".tmp-ckpt-000009-step00000009-deadbeef"
    crash.mkdir()
    (crash / "state.pt").write_bytes(b"half a file")
    assert resume_latest(make_trainer(), tmp_path).folder == newer
    with Checkpointer(tmp_path, SaveConfig(strategy="sync")) as ckpt:
        ckpt.save(make_trainer())
    assert not crash.exists()


def _disk_full_after_half(path, tensors, fmt) -> None:
    path.write_bytes(b"\0" * 1000)
    raise OSError(errno.ENOSPC, "No space left on device", str(path))


def _assert_previous_intact(root: pathlib.Path, previous: pathlib.Path) -> None:
    assert [p.name for p in root.iterdir() if p.name.startswith(".tmp-")] == []
    assert (root / "latest").read_text().strip() == previous.name
    assert load_into(make_trainer(), previous).manifest.step == 2


@pytest.mark.parametrize("async_save", [False, True])
def test_disk_full_mid_save_publishes_nothing(async_save: bool, tmp_path, monkeypatch) -> None:
    _, previous = two_checkpoints(tmp_path)
    monkeypatch.setattr(formats, "write_tensor_file", _disk_full_after_half)
    ckpt = Checkpointer(tmp_path, SaveConfig(strategy="sync", async_save=async_save))
    with pytest.raises(CheckpointError, match="no space left on the device"):
        ckpt.save(make_trainer())
        ckpt.close()
    _assert_previous_intact(tmp_path, previous)


def test_permission_denied_on_commit_publishes_nothing(tmp_path, monkeypatch) -> None:
    _, previous = two_checkpoints(tmp_path)

    def denied(src, dst):
        raise PermissionError(errno.EACCES, "Permission denied", str(dst))

    monkeypatch.setattr(store_module.os, "rename", denied)
    with pytest.raises(CheckpointError, match="permission denied writing in"):
        Checkpointer(tmp_path, SaveConfig(strategy="sync")).save(make_trainer())
    monkeypatch.undo()
    _assert_previous_intact(tmp_path, previous)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_folder_is_a_clear_error(tmp_path) -> None:
    _, previous = two_checkpoints(tmp_path)
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(CheckpointError, match="permission denied"):
            Checkpointer(tmp_path, SaveConfig(strategy="sync")).save(make_trainer())
    finally:
        tmp_path.chmod(0o755)
    _assert_previous_intact(tmp_path, previous)
