"""Checkpoint roots: one writer per root (the flock writer lock), free space before and during a save, roots that
cannot be roots (a file, a URL, one checkpoint folder, a ``latest`` that is not a file), and the selective-resume
warning on every resume path.

Each guard has a control that shows what happens without it: two writers without the lock break each other's saves,
a save without room goes ahead when the space is there, a writer's short write with room left is not called a full
disk, a URL as a ``Path`` is a local folder, a fifo ``latest`` blocks a plain ``open``, a selection that leaves no
trained parameter to the base does not warn.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from ckpt_helpers import CONFIGS, make_trainer
from pytest_flashckpt.checkpoint import (
    CheckpointError,
    CheckpointFallbackWarning,
    CheckpointManager,
    Checkpointer,
    DiskFullError,
    FolderLockedError,
    InvalidRootError,
    SelectiveResumeWarning,
    load_into,
    resume,
    resume_latest,
)
from pytest_flashckpt.checkpoint import checkpointer as checkpointer_module, formats, lock as lock_module, space
from pytest_flashckpt.checkpoint.lock import LOCK_FILE, WriterLock
from pytest_flashckpt.checkpoint.store import CheckpointStore
from pytest_flashckpt.config.scenario import SaveConfig

HERE = Path(__file__).parent


def _saved(root: Path, config: SaveConfig = SaveConfig(strategy="sync"), steps: int = 1) -> Path:
    trainer = make_trainer()
    with Checkpointer(root, config) as ckpt:
        for _ in range(steps):
            trainer.train_step()
            ckpt.save(trainer)
    return root


def _entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


# -- one writer per root -------------------------------------------------------------------------------------------
def test_a_second_writer_in_this_process_is_refused_naming_the_owner(tmp_path) -> None:
    trainer = make_trainer()
    first = Checkpointer(tmp_path, SaveConfig(strategy="sync"))
    pattern = rf"another run is writing checkpoints here: pid {os.getpid()} on host {socket.gethostname()}, since 20\d\d-.*{LOCK_FILE}.*this process"
    with pytest.raises(FolderLockedError, match=pattern):
        Checkpointer(tmp_path, SaveConfig(async_save=True))
    with pytest.raises(FolderLockedError, match=pattern):
        CheckpointManager(tmp_path, model=trainer.model, optimizer=trainer.optimizer)
    trainer.train_step()
    first.save(trainer)  # the holder is untouched by the refusals
    first.close()
    assert LOCK_FILE not in _entries(tmp_path)  # released: the file goes with it
    with CheckpointManager(tmp_path, model=trainer.model, optimizer=trainer.optimizer) as manager:  # free again
        manager.save(2)
    assert CheckpointStore(tmp_path).latest_name().endswith("step00000002")


def _holder_between_flock_and_record(root: Path) -> int:
    """A rival's state in the instant after its flock and before it writes its pid: the lock held, the file empty."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def test_a_writer_refused_while_the_holder_records_itself_names_the_holder(tmp_path) -> None:
    fd = _holder_between_flock_and_record(tmp_path)
    record = json.dumps({"pid": 4242, "host": socket.gethostname(), "since": "2026-12-06T00:00:00+00:00"}).encode()
    writer = threading.Timer(0.2, lambda: os.pwrite(fd, record, 0))  # the holder records itself a moment later
    writer.start()
    try:
        with pytest.raises(FolderLockedError, match=r"pid 4242 on host"):  # the CI failure of stop 49 read no pid here
            Checkpointer(tmp_path, SaveConfig(strategy="sync"))
    finally:
        writer.join()
        os.close(fd)


def test_control_a_holder_that_never_records_itself_is_named_as_such_after_the_wait(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(lock_module, "OWNER_WAIT_S", 0.05)
    fd = _holder_between_flock_and_record(tmp_path)
    try:
        with pytest.raises(FolderLockedError, match="a writer that has not recorded itself yet"):
            Checkpointer(tmp_path, SaveConfig(strategy="sync"))
    finally:
        os.close(fd)


def test_control_without_the_lock_two_writers_break_each_others_saves(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(lock_module.WriterLock, "acquire", lambda self: self)  # the old code: no lock at all
    a, b = make_trainer(), make_trainer(init_seed=1)
    with Checkpointer(tmp_path, SaveConfig(strategy="sync")) as first, Checkpointer(tmp_path, SaveConfig(strategy="sync")) as second:
        a.train_step()
        b.train_step()
        first.save(a)
        with pytest.raises(CheckpointError, match="Directory not empty.*ckpt-000001-step00000001"):  # both reserved that name
            second.save(b)


def test_readers_take_no_lock(tmp_path) -> None:
    trainer = make_trainer()
    with Checkpointer(tmp_path, SaveConfig(strategy="sync")) as ckpt:
        trainer.train_step()
        ckpt.save(trainer)
        assert resume_latest(make_trainer(init_seed=1), tmp_path).manifest.step == 1
        fresh = make_trainer(init_seed=1)
        assert resume(tmp_path, model=fresh.model, optimizer=fresh.optimizer, scheduler=fresh.scheduler) is not None
        load_into(make_trainer(init_seed=1), tmp_path / CheckpointStore(tmp_path).latest_name())


@pytest.mark.slow
def test_a_killed_writer_never_leaves_the_root_locked(tmp_path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pytest_flashckpt.checkpoint.lock import WriterLock; "
         "lock = WriterLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(120)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderLockedError, match=rf"pid {holder.pid} on host .*since .*use another checkpoint folder"):
            Checkpointer(tmp_path, SaveConfig(strategy="sync"))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == holder.pid  # the dead writer's file is still there
    _saved(tmp_path)  # ...but its flock died with it: taken over at once, no stale-pid guess
    assert CheckpointStore(tmp_path).latest_name() is not None


def test_a_filesystem_without_flock_is_named(tmp_path, monkeypatch) -> None:
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lock_module.fcntl, "flock", no_flock)
    with pytest.raises(CheckpointError, match=r"does not support flock \(ENOLCK\).*local disk"):
        Checkpointer(tmp_path, SaveConfig(strategy="sync"))


def test_a_lock_released_while_another_run_opened_it_is_retaken_on_the_new_file(tmp_path) -> None:
    first = WriterLock(tmp_path).acquire()
    stale_fd = os.open(first.path, os.O_RDWR)  # a run that opened the file just before the release...
    first.release()
    second = WriterLock(tmp_path)
    real_open = os.open
    calls = iter([stale_fd])

    def open_once_stale(path, flags, mode=0o777):
        return next(calls, None) or real_open(path, flags, mode)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lock_module.os, "open", open_once_stale)  # ...locks the removed file: it must see that, lock the new one
        second.acquire()
    assert second.held and os.fstat(second._fd).st_ino == os.stat(second.path).st_ino
    with pytest.raises(FolderLockedError):
        WriterLock(tmp_path).acquire()
    second.release()


# -- free space ----------------------------------------------------------------------------------------------------
def _usage(free: int) -> SimpleNamespace:
    return SimpleNamespace(total=free * 4, used=free * 3, free=free)  # what shutil.disk_usage returns, the space it says


@pytest.mark.parametrize("config", [SaveConfig(strategy="sync"), SaveConfig(async_save=True)], ids=["sync", "async"])
def test_a_save_that_does_not_fit_is_refused_before_anything_is_written(tmp_path, monkeypatch, config) -> None:
    root = _saved(tmp_path / "ckpt")
    trainer = make_trainer()
    trainer.train_step()
    needed: list[int] = []
    real_check = space.check_free_space
    monkeypatch.setattr(checkpointer_module, "check_free_space", lambda root, n, what: (needed.append(n), real_check(root, n, what))[1])
    monkeypatch.setattr(space.shutil, "disk_usage", lambda path: _usage(needed[-1] - 1))
    with Checkpointer(root, config) as ckpt:
        before = _entries(root)
        with pytest.raises(DiskFullError, match=r"save of step 1 into .* refused: needs [\d.]+ MiB, [\d.]+ MiB free on /.*nothing was written"):
            ckpt.save(trainer)
        assert _entries(root) == before and ckpt.records == []  # no .tmp folder, no record
        monkeypatch.setattr(space.shutil, "disk_usage", lambda path: _usage(needed[-1]))  # control: exactly enough
        ckpt.save(trainer)
    assert len(CheckpointStore(root).complete()) == 2


def test_the_bytes_a_save_needs_bound_what_every_strategy_writes(tmp_path, monkeypatch) -> None:
    needed: list[int] = []
    real_check = space.check_free_space
    monkeypatch.setattr(checkpointer_module, "check_free_space", lambda root, n, what: (needed.append(n), real_check(root, n, what))[1])
    for name, config in CONFIGS.items():
        needed.clear()
        root = _saved(tmp_path / name, config, steps=2)  # a selective run's second save is the selection only
        folders = CheckpointStore(root).complete()
        assert len(folders) == len(needed) == 2, name
        for folder, bound in zip(folders, needed):
            on_disk = sum(max(p.stat().st_size, p.stat().st_blocks * 512) for p in folder.rglob("*"))
            assert on_disk <= bound, (name, folder.name, on_disk, bound)


def _half_then(error: BaseException):
    def writer(path, tensors, fmt):
        path.write_bytes(b"\0" * 4096)  # a partial file, as a real short write leaves
        raise error

    return writer


def test_a_disk_that_fills_during_the_write_is_named_and_the_half_written_folder_removed(tmp_path, monkeypatch) -> None:
    root = _saved(tmp_path / "ckpt")
    latest = CheckpointStore(root).latest_name()
    trainer = make_trainer()
    trainer.train_step()
    monkeypatch.setattr(formats, "write_tensor_file", _half_then(OSError(errno.ENOSPC, "No space left on device")))
    with Checkpointer(root, SaveConfig(strategy="sync")) as ckpt:
        with pytest.raises(DiskFullError, match=r"no space left on the device holding .*filled up during the write.*needs [\d.]+ MiB.*half-written \.tmp-ckpt-000002.* removed"):
            ckpt.save(trainer)
    assert not [n for n in _entries(root) if n.startswith(".tmp-")]
    assert CheckpointStore(root).latest_name() == latest


def test_torchs_errno_less_short_write_is_a_full_disk_only_when_the_rest_does_not_fit(tmp_path, monkeypatch) -> None:
    short = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")  # torch.save on ENOSPC
    root = _saved(tmp_path / "ckpt")
    trainer = make_trainer()
    trainer.train_step()
    monkeypatch.setattr(formats, "write_tensor_file", _half_then(short))
    disk = {"free": 0}
    monkeypatch.setattr(space.shutil, "disk_usage", lambda path: _usage(disk["free"]))
    monkeypatch.setattr(checkpointer_module, "check_free_space", lambda *args: None)  # the disk filled after the check
    with Checkpointer(root, SaveConfig(strategy="sync")) as ckpt:
        with pytest.raises(DiskFullError, match=r"torch's writer stopped short: 'unexpected pos 576 vs 534'"):
            ckpt.save(trainer)
        disk["free"] = 1 << 40  # control: the same short write with room to spare is some other failure, shown as it is
        with pytest.raises(RuntimeError, match="unexpected pos") as other:
            ckpt.save(trainer)
        assert not isinstance(other.value, DiskFullError)
    assert not [n for n in _entries(root) if n.startswith(".tmp-")]


def test_a_full_disk_before_the_first_byte_is_a_disk_full_error_too(tmp_path, monkeypatch) -> None:
    real_open, real_mkdir = os.open, Path.mkdir

    def full_open(path, flags, mode=0o777):
        if str(path).endswith(LOCK_FILE):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, flags, mode)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lock_module.os, "open", full_open)
        with pytest.raises(DiskFullError, match=rf"{LOCK_FILE}: cannot create the writer lock: no space left on the device"):
            Checkpointer(tmp_path / "a", SaveConfig(strategy="sync"))

    def full_mkdir(self, *args, **kwargs):
        if self.name.startswith(".tmp-"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_mkdir(self, *args, **kwargs)

    trainer = make_trainer()
    trainer.train_step()
    with Checkpointer(tmp_path / "b", SaveConfig(strategy="sync")) as ckpt:
        monkeypatch.setattr(Path, "mkdir", full_mkdir)  # the temporary folder of the save cannot be made
        with pytest.raises(DiskFullError, match="no space left on the device holding"):
            ckpt.save(trainer)


def test_the_cli_names_a_url_root(capsys) -> None:
    from pytest_flashckpt.cli import main

    assert main(["inspect", "s3://bucket/run"]) == 2
    err = capsys.readouterr().err
    assert "s3:// URLs are not supported" in err and "Traceback" not in err


def _can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True, text=True)  # fmt: skip
    return probe.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount_tmpfs(), reason="no unprivileged user+mount namespace here, so no small tmpfs to fill")
def test_a_real_small_filesystem_refuses_then_reports_the_full_disk(tmp_path) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    script = f'mount -t tmpfs -o size=256k tmpfs "$1" && exec {sys.executable} {HERE / "small_disk_writer.py"} "$1"'
    run = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh", str(mount)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["checked"].startswith("DiskFullError") and "refused: needs" in out["checked"] and f"free on {mount}" in out["checked"], out["checked"]
    for name in ("torch", "safetensors", "dcp", "async"):
        assert out[name].startswith("DiskFullError") and "filled up during the write" in out[name], (name, out[name])
        assert out[f"{name}_left"] == [], (name, out[f"{name}_left"])  # no half-written folder, the lock released
    assert out["free_after"] == out["free_before"]


# -- roots that cannot be roots ------------------------------------------------------------------------------------
def _writers_and_readers(root):
    trainer = make_trainer()
    return {
        "Checkpointer": lambda: Checkpointer(root, SaveConfig(strategy="sync")),
        "CheckpointManager": lambda: CheckpointManager(root, model=trainer.model, optimizer=trainer.optimizer),
        "resume_latest": lambda: resume_latest(trainer, root),
        "resume": lambda: resume(root, model=trainer.model, optimizer=trainer.optimizer),
    }


def test_a_root_that_is_a_file_is_named_as_such(tmp_path) -> None:
    root = tmp_path / "ckpt"
    root.write_text("my notes")
    for name, call in _writers_and_readers(root).items():
        with pytest.raises(InvalidRootError, match=rf"checkpoint root {root} is a file, not a folder; pass the folder"):
            call()
    assert root.read_text() == "my notes"
    with pytest.raises(FileExistsError, match="File exists"):  # control: all the old code had to say
        root.mkdir(parents=True, exist_ok=True)
    inner = root / "sub"
    with pytest.raises(InvalidRootError, match=rf"{root} is a file, not a folder, so the root cannot be created"):
        Checkpointer(inner, SaveConfig(strategy="sync"))


def test_a_root_that_is_one_checkpoint_is_named_and_its_parent_offered(tmp_path) -> None:
    root = _saved(tmp_path / "ckpt")
    one = root / CheckpointStore(root).latest_name()
    for name, call in _writers_and_readers(one).items():
        with pytest.raises(InvalidRootError, match=rf"is one checkpoint \(it holds manifest.json\).*pass its parent {root}"):
            call()
    assert resume_latest(make_trainer(init_seed=1), root) is not None  # control: its parent is the root


@pytest.mark.parametrize("url", ["s3://bucket/run", "gs://bucket/run", "hdfs://namenode/run", "az://container/run", "file:///tmp/run"])
def test_fsspec_urls_are_refused_with_what_is_supported(tmp_path, monkeypatch, url) -> None:
    monkeypatch.chdir(tmp_path)
    for name, call in _writers_and_readers(url).items():
        with pytest.raises(InvalidRootError, match=r"URLs are not supported; a root is a folder on a local POSIX filesystem"):
            call()
    for name, call in _writers_and_readers(Path(url)).items():  # what Path() leaves of it ("s3:/bucket/run") too
        with pytest.raises(InvalidRootError, match="URLs are not supported"):
            call()
    assert list(tmp_path.iterdir()) == []  # no local "s3:" folder
    fix = "pass the plain path '/tmp/run'" if url.startswith("file") else "copy the committed ckpt-\\* folders"
    with pytest.raises(InvalidRootError, match=fix):
        resume_latest(make_trainer(), url)
    assert Path(url).parts[0].endswith(":")  # control: as a Path, a URL is a local relative folder


def test_a_latest_that_is_not_a_file_is_named(tmp_path) -> None:
    root = _saved(tmp_path / "ckpt")
    newest = CheckpointStore(root).latest_name()
    (root / "latest").unlink()
    (root / "latest").mkdir()
    with pytest.raises(InvalidRootError, match=rf"{root / 'latest'} is a folder, not the pointer file"):
        Checkpointer(root, SaveConfig(strategy="sync"))
    with pytest.warns(CheckpointFallbackWarning, match="latest: not a plain file"):
        assert resume_latest(make_trainer(init_seed=1), root).folder.name == newest  # a reader falls back


def test_a_fifo_latest_does_not_block_a_resume(tmp_path) -> None:
    root = _saved(tmp_path / "ckpt")
    (root / "latest").unlink()
    os.mkfifo(root / "latest")
    opened = threading.Thread(target=lambda: open(root / "latest").close(), daemon=True)
    opened.start()
    opened.join(0.3)
    assert opened.is_alive()  # control: a plain open of a fifo blocks until a writer comes
    os.close(os.open(root / "latest", os.O_WRONLY | os.O_NONBLOCK))  # let it go
    opened.join(5)
    with pytest.warns(CheckpointFallbackWarning, match="not a plain file"):
        assert resume_latest(make_trainer(init_seed=1), root) is not None
    with pytest.raises(InvalidRootError, match="special file"):
        Checkpointer(root, SaveConfig(strategy="sync"))


# -- the selective-resume warning, on every resume path -------------------------------------------------------------
def _selective(root: Path, select_params) -> None:
    trainer = make_trainer()
    with Checkpointer(root, SaveConfig(select_params=select_params)) as ckpt:
        for _ in range(2):
            trainer.train_step()
            ckpt.save(trainer)


def test_every_resume_path_warns_on_trained_parameters_left_to_the_base(tmp_path) -> None:
    _selective(tmp_path, ["blocks.*"])  # the embeddings and the head are trained but left to the base
    fresh = make_trainer(init_seed=1)
    paths = {
        "resume_latest": lambda: resume_latest(fresh, tmp_path),
        "resume": lambda: resume(tmp_path, model=fresh.model, optimizer=fresh.optimizer, scheduler=fresh.scheduler),
        "CheckpointManager.resume": lambda: CheckpointManager(tmp_path, model=fresh.model, optimizer=fresh.optimizer, scheduler=fresh.scheduler).resume(),
    }
    for name, call in paths.items():
        with pytest.warns(SelectiveResumeWarning, match=r"trainable parameter\(s\) came from the selective checkpoint's base .*wte\.weight") as caught:
            call()
        assert [Path(w.filename).name for w in caught] == [Path(__file__).name], name  # it points at the caller's line


def test_control_a_selection_of_every_trained_parameter_does_not_warn(tmp_path) -> None:
    _selective(tmp_path, "trainable")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resume_latest(make_trainer(init_seed=1), tmp_path).manifest.base is not None  # a selective one, no warning


# -- two processes racing for every save strategy's root -------------------------------------------------------------
@pytest.mark.slow
def test_two_processes_racing_for_every_strategys_root_one_writer_each(tmp_path) -> None:
    procs = [subprocess.Popen([sys.executable, str(HERE / "rival_writer.py"), str(tmp_path), order], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for order in ("forward", "reverse")]  # fmt: skip
    try:
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        reports = [json.loads(proc.stdout.readline()) for proc in procs]
        for name in CONFIGS:
            holders = [r for r in reports if name in r["held"]]
            losers = [r for r in reports if name in r["refused"]]
            assert len(holders) == 1 and len(losers) == 1, (name, reports)
            assert f"pid {holders[0]['pid']} on host" in losers[0]["refused"][name]
            with pytest.raises(FolderLockedError, match=f"pid {holders[0]['pid']}"):  # a third writer: this process
                Checkpointer(tmp_path / name, CONFIGS[name])
        for proc in procs:
            proc.stdin.write("save\n")
            proc.stdin.flush()
        assert [proc.stdout.readline().strip() for proc in procs] == ["done", "done"]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
            proc.stdin.close()
            proc.stdout.close()
    for name in CONFIGS:
        root = tmp_path / name
        store = CheckpointStore(root)
        folders = store.complete()
        assert [f.name.split("-step")[0] for f in folders] == ["ckpt-000001", "ckpt-000002", "ckpt-000003"], name
        for folder in folders:
            load_into(make_trainer(init_seed=1), folder)
        assert resume_latest(make_trainer(init_seed=1), root).manifest.step == 3
        assert _entries(root) == sorted([*(f.name for f in folders), "latest"])  # no lock file, no leftovers


# -- the sharded (DCP, FSDP) checkpointer: the same root and space checks --------------------------------------------
def test_the_sharded_checkpointer_refuses_a_file_root_and_a_checkpoint_root(tmp_path) -> None:
    from pytest_flashckpt.checkpoint import dcp_io
    from pytest_flashckpt.distributed.sharded_store import ShardedCheckpointer

    root = tmp_path / "ckpt"
    root.write_text("my notes")
    one = _saved(tmp_path / "other") / CheckpointStore(tmp_path / "other").latest_name()
    with dcp_io.process_group():
        with pytest.raises(InvalidRootError, match=rf"checkpoint root {root} is a file, not a folder"):
            ShardedCheckpointer(root)
        with pytest.raises(InvalidRootError, match=r"is one checkpoint \(it holds manifest.json\)"):
            ShardedCheckpointer(one)
    assert root.read_text() == "my notes"


def test_a_sharded_save_that_does_not_fit_is_refused_before_anything_is_written(tmp_path, monkeypatch) -> None:
    from pytest_flashckpt.checkpoint import dcp_io
    from pytest_flashckpt.distributed import sharded_store

    trainer = make_trainer()
    trainer.train_step()
    needed: list[int] = []
    real_check = space.check_free_space
    monkeypatch.setattr(sharded_store, "check_free_space", lambda root, n, what: (needed.append(n), real_check(root, n, what))[1])
    monkeypatch.setattr(space.shutil, "disk_usage", lambda path: _usage(needed[-1] - 1))
    root = tmp_path / "root"
    with dcp_io.process_group(), sharded_store.ShardedCheckpointer(root) as ckpt:
        before = _entries(root) if root.exists() else []
        with pytest.raises(DiskFullError, match=r"sharded save of step 1 into .* refused: needs [\d.]+ MiB, .*nothing was written"):
            ckpt.save(trainer)
        assert (_entries(root) if root.exists() else []) == before and ckpt.saves == []
        monkeypatch.setattr(space.shutil, "disk_usage", lambda path: _usage(needed[-1]))  # control: exactly enough
        folder = ckpt.save(trainer).folder
    written = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert written <= needed[-1]  # the bound holds for what the save wrote
