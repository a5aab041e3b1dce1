"""Small OS helpers every layer may use: the atomic file write and the process's resident set.

``atomic_write`` is how results.json, baselines, the report and its plots are written: a temporary file in the
same folder, flushed and fsync'd, then renamed over the target (and the folder fsync'd), so a reader sees the
old file or the new one, never half of one. (Checkpoints keep their own commit protocol in ``checkpoint/store``.)
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import BinaryIO, Iterator

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def atomic_write(path: Path | str) -> Iterator[BinaryIO]:
    """``with atomic_write(path) as fh: fh.write(data)``: ``path`` is replaced only when the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a temporary name of this writer's own: two writers of one file at once never rename each other's half file
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    with contextlib.suppress(OSError):  # not every filesystem lets a folder be opened for fsync
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_text(path: Path | str, text: str) -> None:
    with atomic_write(path) as fh:
        fh.write(text.encode("utf-8"))


def resident_bytes() -> int:
    """The process's resident set size (``/proc/self/statm``, second field, in pages)."""
    with open("/proc/self/statm", encoding="ascii") as fh:
        return int(fh.read().split()[1]) * PAGE_SIZE


def shown_path(path: Path | str, root: Path | str | None = None) -> str:
    """``path`` as a user should read it: relative to ``root`` (default: the current folder) when it lies below it,
    as given otherwise. Reports and terminal lines show ``baselines/<profile>.json``, never a machine's home folder."""
    path = Path(path)
    base = Path(root) if root is not None else Path.cwd()
    try:
        return path.resolve().relative_to(base.resolve()).as_posix() if path.is_absolute() else path.as_posix()
    except ValueError:
        return path.as_posix()


@contextlib.contextmanager
def locked(folder: Path | str) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (``fcntl.flock`` on the folder itself, so no lock file is left in a
    committed folder such as ``baselines/``): another process or thread taking the same lock waits until the
    block ends. Used around a baseline's read-merge-write and around writing a report folder's files as one unit,
    so two runs at once neither drop each other's scenarios nor leave one run's results beside another's report."""
    import fcntl

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
