"""The folder of checkpoints and the commit protocol that keeps it consistent across crashes.

A save writes into ``.tmp-<name>-<random>`` beside its target, fsyncs every file, writes the manifest, fsyncs the
folder, renames it to ``<name>`` (atomic on one filesystem), fsyncs the parent, and only then replaces the ``latest``
file (write a temporary file, fsync, ``os.replace``, fsync the parent). A crash at any point leaves either the old or
the new ``latest``, both pointing at complete folders; leftovers are ``.tmp-*`` folders, which are never loaded and
are removed by the next save.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import uuid
from pathlib import Path

from pytest_flashckpt.checkpoint.errors import CheckpointError, CorruptCheckpointError, DiskFullError
from pytest_flashckpt.checkpoint.formats import fsync_path
from pytest_flashckpt.checkpoint.manifest import MANIFEST
from pytest_flashckpt.checkpoint.paths import plain_name

LATEST = "latest"
TMP_PREFIX = ".tmp-"
_NAME = re.compile(r"^ckpt-(\d{6})-step(\d{8})$")


def checkpoint_name(seq: int, step: int) -> str:
    return f"ckpt-{seq:06d}-step{step:08d}"


def parse_name(name: str) -> tuple[int, int] | None:
    """(sequence, step) of a checkpoint folder name, or None for anything else."""
    match = _NAME.match(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def describe_os_error(exc: OSError, where: Path) -> str:
    """A one-line cause and fix for the errors a save meets in practice."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device holding {where}; free space or set max_keep to rotate old checkpoints"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"permission denied writing in {where}; make the folder writable or choose another checkpoint folder"
    return f"{type(exc).__name__} while writing in {where}: {exc}"


def os_failure(exc: OSError, where: Path) -> CheckpointError:
    """:func:`describe_os_error` as the error to raise: a ``DiskFullError`` for a full disk or quota."""
    kind = DiskFullError if exc.errno in (errno.ENOSPC, errno.EDQUOT) else CheckpointError
    return kind(describe_os_error(exc, where))


class CheckpointStore:
    """One folder of checkpoints: temporary folders, commits, the ``latest`` pointer, listing and cleanup."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._owned_tmp: set[Path] = set()
        names = [parse_name(p.name) for p in self.root.iterdir()] if self.root.is_dir() else []
        self._next_seq = max((n[0] for n in names if n), default=0) + 1

    def reserve_name(self, step: int) -> str:
        name = checkpoint_name(self._next_seq, step)
        self._next_seq += 1
        return name

    def begin(self, name: str) -> Path:
        """Create the temporary folder a save writes into (cleaning leftovers of crashed saves first)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self.clean_leftovers()
            tmp = self.root / f"{TMP_PREFIX}{name}-{uuid.uuid4().hex[:8]}"
            tmp.mkdir()
        except OSError as exc:
            raise os_failure(exc, self.root) from exc
        self._owned_tmp.add(tmp)
        return tmp

    def commit(self, tmp: Path, name: str) -> Path:
        """Publish a fully written temporary folder as ``name`` and point ``latest`` at it."""
        target = self.root / name
        try:
            for sub in sorted((p for p in tmp.rglob("*") if p.is_dir()), reverse=True):
                fsync_path(sub)
            fsync_path(tmp)
            os.rename(tmp, target)
            fsync_path(self.root)
            self._set_latest(name)
        except OSError as exc:
            raise os_failure(exc, self.root) from exc
        finally:
            self._owned_tmp.discard(tmp)
        return target

    def abort(self, tmp: Path) -> None:
        """Remove a temporary folder after a failed save (best effort: a leftover is harmless)."""
        shutil.rmtree(tmp, ignore_errors=True)
        self._owned_tmp.discard(tmp)

    def _set_latest(self, name: str) -> None:
        pointer = self.root / LATEST
        tmp = self.root / f"{TMP_PREFIX}{LATEST}-{uuid.uuid4().hex[:8]}"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(name + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, pointer)
        fsync_path(self.root)

    def latest_name(self) -> str | None:
        """The checkpoint ``latest`` names, or None without one. A ``latest`` that names anything but a folder
        directly inside the root (``/etc``, ``/``, ``../x``, a symlink out) or cannot be read is a
        ``CorruptCheckpointError`` naming it: it is never followed out of the root."""
        pointer = self.root / LATEST
        if not pointer.exists() and not pointer.is_symlink():
            return None
        plain_name(self.root, LATEST, "pointer")  # a latest symlinked out of the root is not even read
        if not pointer.is_file():  # a folder, a fifo (whose open would block), a socket: never opened
            raise CorruptCheckpointError(f"{pointer}: not a plain file (the pointer this library writes is one line naming a checkpoint folder); move it away or delete it to resume from the newest complete checkpoint")
        try:
            with open(pointer, encoding="utf-8") as fh:
                name = fh.read(4096).strip() or None  # a checkpoint name is ~25 characters
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise CorruptCheckpointError(f"{pointer}: unreadable ({type(exc).__name__}); delete it to resume from the newest complete checkpoint") from None
        if name is not None:
            plain_name(self.root, name, f"{LATEST} target")
        return name

    def complete(self) -> list[Path]:
        """Committed checkpoint folders (they have a manifest), oldest first by sequence number."""
        if not self.root.is_dir():
            return []
        found = [(parse_name(p.name), p) for p in self.root.iterdir() if p.is_dir()]
        return [p for key, p in sorted((k, p) for k, p in found if k) if (p / MANIFEST).is_file()]

    def clean_leftovers(self) -> list[Path]:
        """Delete ``.tmp-*`` entries that no save of this store is writing (crash leftovers)."""
        removed = []
        for p in self.root.iterdir():
            if p.name.startswith(TMP_PREFIX) and p not in self._owned_tmp:
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                removed.append(p)
        return removed

    def delete(self, folder: Path) -> None:
        """Remove a checkpoint: first renamed to a temporary name, so a half-deleted folder never looks complete."""
        doomed = self.root / f"{TMP_PREFIX}deleting-{folder.name}-{uuid.uuid4().hex[:8]}"
        os.rename(folder, doomed)
        fsync_path(self.root)
        shutil.rmtree(doomed, ignore_errors=True)
