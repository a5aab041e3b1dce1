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
    NoCheckpointError,
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


def test_no_checkpoint_yet_is_none_with_a_logged_reason_or_an_error_when_required(tmp_path, caplog) -> None:
    missing, empty = tmp_path / "never-made", tmp_path / "empty"
    empty.mkdir()
    with caplog.at_level("INFO", logger="pytest_flashckpt.checkpoint.loading"):
        assert resume_latest(make_trainer(), missing) is None
        assert resume_latest(make_trainer(), empty) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"no checkpoint yet: {missing} does not exist; starting from scratch",
        f"no checkpoint yet: {empty} holds no committed checkpoint; starting from scratch",
    ]
    with pytest.raises(NoCheckpointError, match=f"no checkpoint yet: {missing} does not exist; check the path"):
        resume_latest(make_trainer(), missing, required=True)
    with pytest.raises(NoCheckpointError, match="holds no committed checkpoint"):
        resume_latest(make_trainer(), empty, required=True)
    assert not missing.exists()  # looking never creates the folder


def test_a_latest_naming_a_missing_folder_has_its_own_message(tmp_path) -> None:
    older, newer = two_checkpoints(tmp_path)
    (tmp_path / "latest").write_text("ckpt-000099-step00000099\n")
    with pytest.warns(CheckpointFallbackWarning, match="names 'ckpt-000099-step00000099', which does not exist") as caught:
        assert resume_latest(make_trainer(), tmp_path).folder == newer
    assert "never committed" not in str(caught[0].message)
    for folder in (older, newer):
        flip_byte(folder / "state.pt", 200)
    with pytest.raises(CheckpointError, match="latest names 'ckpt-000099-step00000099', which does not exist in"):
        resume_latest(make_trainer(), tmp_path)


def test_loading_a_folder_that_does_not_exist_says_so(tmp_path) -> None:
    with pytest.raises(NoCheckpointError, match="ckpt-000001-step00000001: no such checkpoint folder"):
        load_into(make_trainer(), tmp_path / "ckpt-000001-step00000001")


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
