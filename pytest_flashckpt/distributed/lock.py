"""One writer per checkpoint folder: ``<root>/.writer.lock`` names the pid and host of the run saving there.

A second run that starts saving into the same folder is refused (two writers would race on ``latest`` and on the
sequence numbers of checkpoint names). A lock left by a dead process on this host is stale and taken over; a lock
from another host cannot be checked from here, so the error names it and says to delete the file if that run is gone.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from pytest_flashckpt.checkpoint.errors import CheckpointError

LOCK_FILE = ".writer.lock"


class FolderLockedError(CheckpointError):
    """Another live run is writing checkpoints into this folder."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    return True


class WriterLock:
    """``with WriterLock(root): ...`` or ``acquire()`` / ``release()``; re-entrant for the owning process."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.path = self.root / LOCK_FILE
        self.held = False

    def acquire(self) -> "WriterLock":
        self.root.mkdir(parents=True, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname()}
        for _ in range(2):  # second try after removing a stale lock
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                owner = self._owner()
                if owner == me:
                    self.held = True
                    return self
                if owner is not None and owner.get("host") == me["host"] and not _alive(int(owner.get("pid", -1))):
                    self.path.unlink(missing_ok=True)  # stale: its process is gone
                    continue
                raise FolderLockedError(
                    f"{self.root}: another run is writing checkpoints here ({self.path} names pid {owner and owner.get('pid')} "
                    f"on host {owner and owner.get('host')}); use another checkpoint folder, or delete {self.path} if that run is gone"
                ) from None
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(me, fh)
                fh.flush()
                os.fsync(fh.fileno())
            self.held = True
            return self
        raise FolderLockedError(f"{self.root}: could not take the writer lock {self.path} (another run took it first)")

    def _owner(self) -> dict | None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return data if isinstance(data, dict) else None
        except (OSError, ValueError):
            return None  # unreadable: treated as held by an unknown run

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def __enter__(self) -> "WriterLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
