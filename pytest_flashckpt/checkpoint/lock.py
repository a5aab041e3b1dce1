"""One writer per checkpoint root: ``<root>/.writer.lock``, held with ``fcntl.flock`` for as long as its writer lives.

Two writers in one root race on the sequence numbers of checkpoint names (both reserve ``ckpt-000001-...``), on
``latest``, and on each other's temporary folders (a save removes ``.tmp-*`` folders it does not own). So a second
writer -- another process, or another ``Checkpointer`` / ``CheckpointManager`` in the same process -- is refused,
with the owner's pid, host, start time and the lock file. Readers (load, resume, inspect, export) take no lock.

Why ``flock`` and not a pid file: the kernel drops the lock when the last descriptor of its open file closes, so a
writer that exits, crashes or is killed with SIGKILL never leaves the root locked, and a recycled pid cannot make a
dead writer look alive. The lock belongs to the open file, not to the process: a second ``open`` in the same process
conflicts too (two managers in one process), and a child forked without exec inherits it (``O_CLOEXEC`` covers
exec) and keeps the root locked while it lives. The lock is a regular file opened for writing, not the folder:
Linux's NFS client emulates ``flock`` with a byte-range lock, which needs a file open for writing.

The JSON in the file (pid, host, since) only names the owner in the error; the owner writes it just after its flock, so
a refused writer waits briefly for it (``OWNER_WAIT_S``). A file a crashed writer left on this host
is taken over (its flock is gone). One naming another host is not: where ``flock`` does not reach across machines
(NFS mounted ``nolock`` or ``local_lock=flock``, Lustre with ``localflock``) its writer may still be alive, so the
error says to delete the file if that run is gone. A filesystem without ``flock`` (Lustre mounted ``noflock``) is
refused with that cause.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
import weakref
from datetime import datetime, timezone
from pathlib import Path

from pytest_flashckpt.checkpoint.errors import CheckpointError
from pytest_flashckpt.checkpoint.store import os_failure

LOCK_FILE = ".writer.lock"
OWNER_WAIT_S = 2.0  # how long a refused writer waits for the holder to record its pid (it takes microseconds)
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


class FolderLockedError(CheckpointError):
    """Another live writer holds this checkpoint root."""


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    return True


class WriterLock:
    """``with WriterLock(root): ...`` or ``acquire()`` / ``release()``. Acquiring a lock this object already holds
    is a no-op; any other holder, in this process or another, is refused (:class:`FolderLockedError`)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.path = self.root / LOCK_FILE
        self.host = socket.gethostname()
        self._fd: int | None = None
        self._closer: weakref.finalize | None = None  # a lock dropped without release() is freed when collected

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> "WriterLock":
        if self._fd is not None:
            return self
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            for _ in range(8):  # another writer released (removed) the file between our open and our flock: retry
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                try:
                    taken = self._take(fd)
                except BaseException:
                    os.close(fd)
                    raise
                if taken:
                    self._fd, self._closer = fd, weakref.finalize(self, os.close, fd)
                    return self
                os.close(fd)
        except OSError as exc:
            failure = os_failure(exc, self.root)  # a DiskFullError for a full disk
            raise type(failure)(f"{self.path}: cannot create the writer lock: {failure}") from None
        raise FolderLockedError(f"{self.root}: the writer lock {self.path} was taken and released repeatedly by other runs; use one writer per checkpoint folder")

    def _take(self, fd: int) -> bool:
        """flock ``fd``; False if the file it opened is no longer the lock file (removed by a release meanwhile)."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderLockedError(self._held_message(self._recorded_owner(fd))) from None
        except OSError as exc:
            if exc.errno in _NO_FLOCK:
                raise CheckpointError(
                    f"{self.path}: this filesystem does not support flock ({errno.errorcode.get(exc.errno, exc.errno)}), so no writer "
                    "lock can keep two runs apart; put the checkpoint root on a local disk (or mount Lustre with -o flock)"
                ) from None
            raise
        try:
            if os.fstat(fd).st_ino != os.stat(self.path).st_ino:
                return False
        except FileNotFoundError:
            return False
        owner = self._owner(fd)
        if owner and owner.get("host") != self.host:
            raise FolderLockedError(
                f"{self.root}: another run is writing checkpoints here: {self._who(owner)} (lock {self.path}); a run on another "
                f"host cannot be checked from {self.host}, and flock may not reach across hosts on this filesystem; use another "
                f"checkpoint folder, or delete {self.path} if that run is gone"
            )
        me = {"pid": os.getpid(), "host": self.host, "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode("utf-8"), 0)
        os.fsync(fd)
        return True  # a file left by a dead writer on this host: its flock died with it, so it is ours now

    @staticmethod
    def _owner(fd: int) -> dict | None:
        try:
            data = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    @classmethod
    def _recorded_owner(cls, fd: int) -> dict | None:
        """The holder's record, waiting up to ``OWNER_WAIT_S`` for it: a writer flocks the file before it writes its pid, so
        a rival refused in between would otherwise read an empty (or half-written) file and name nobody."""
        deadline = time.monotonic() + OWNER_WAIT_S
        while (owner := cls._owner(fd)) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return owner

    @staticmethod
    def _who(owner: dict) -> str:
        return f"pid {owner.get('pid')} on host {owner.get('host')}, since {owner.get('since', 'an unrecorded time')}"

    def _held_message(self, owner: dict | None) -> str:
        if owner is None:
            who, why = "a writer that has not recorded itself yet", ""
        else:
            who, why = self._who(owner), ""
            if owner.get("host") == self.host and owner.get("pid") == os.getpid():
                why = " -- this process: another Checkpointer or CheckpointManager on this folder is still open; close() it or use one"
            elif owner.get("host") == self.host and not _alive(owner.get("pid")):
                why = " -- that pid is gone, so a process it forked still holds the lock file open; stop that process"
        return (
            f"{self.root}: another run is writing checkpoints here: {who} (lock {self.path}){why}; use another checkpoint "
            "folder, or stop that run (its lock is freed when it exits, even if it is killed)"
        )

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            self._closer.detach()  # type: ignore[union-attr]
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:  # not a file someone put in its place
                    self.path.unlink()  # while still locked: a run that opened it meanwhile sees it gone and retries
            except FileNotFoundError:
                pass
            finally:
                os.close(fd)

    def __enter__(self) -> "WriterLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
