"""Faults of a sharded save: a rank killed mid-save commits nothing (``latest`` keeps naming the previous checkpoint,
which loads), and a folder another live run is writing into is refused."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_flashckpt.distributed.lock import LOCK_FILE, FolderLockedError, WriterLock

WORKER = Path(__file__).with_name("fault_worker.py")


def test_a_folder_another_live_run_writes_into_is_refused(tmp_path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, json, os, socket, sys, time; "  # what WriterLock does: flock, then the owner's name
         f"fd = os.open(os.path.join(sys.argv[1], {LOCK_FILE!r}), os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); "
         "os.write(fd, json.dumps({'pid': os.getpid(), 'host': socket.gethostname()}).encode()); "
         "print('held', flush=True); time.sleep(60)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderLockedError, match=rf"pid {holder.pid} on host .*use another checkpoint folder"):
            WriterLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    with WriterLock(tmp_path) as lock:  # its process is gone: the lock is stale and taken over
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_lock_from_another_host_is_never_taken_over(tmp_path) -> None:
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": socket.gethostname() + "-elsewhere"}))
    with pytest.raises(FolderLockedError, match="delete .* if that run is gone"):
        WriterLock(tmp_path).acquire()


@pytest.mark.distributed
@pytest.mark.slow
def test_a_rank_killed_during_a_save_leaves_the_previous_checkpoint_as_latest(tmp_path) -> None:
    from pytest_flashckpt.checkpoint.store import CheckpointStore
    from pytest_flashckpt.distributed import launcher, sharded_store
    from pytest_flashckpt.distributed.reshard import make_trainer

    root = tmp_path / "ckpt"
    start = time.perf_counter()
    with pytest.raises(launcher.LaunchError, match="failed") as failure:
        launcher.run(launcher.Launch(2, timeout_s=300), str(WORKER), [str(root)])
    assert "Signals.SIGKILL" in failure.value.log or "SIGKILL" in failure.value.log
    assert time.perf_counter() - start < 300  # ended by torchrun, not by our timeout
    store = CheckpointStore(root)
    assert [p.name for p in store.complete()] == [store.latest_name()] == ["ckpt-000001-step00000001"]
    assert any(p.name.startswith(".tmp-ckpt-000002") for p in root.iterdir())  # the killed save, never committed
    trainer = make_trainer(distributed=False)
    assert sharded_store.load_plain(trainer, root / store.latest_name())["step"] == trainer.step == 1
    WriterLock(root).acquire().release()  # the killed run's lock is stale


def test_a_sharded_checkpointer_refuses_a_folder_another_run_writes_into(tmp_path) -> None:
    from pytest_flashckpt.checkpoint.errors import CheckpointError
    from pytest_flashckpt.distributed.sharded_store import ShardedCheckpointer

    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": socket.gethostname() + "-other"}))
    with pytest.raises(CheckpointError, match="another run is writing checkpoints here"):
        with ShardedCheckpointer(tmp_path):
            pass
    assert [p.name for p in tmp_path.iterdir()] == [LOCK_FILE]  # nothing written, the other run's lock kept
