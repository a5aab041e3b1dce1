"""Small OS helpers every layer may use: the atomic file write and the process's resident set.

``atomic_write`` is how results.json, baselines, the report and its plots are written: a temporary file in a
folder beside the target, flushed and fsync'd, then renamed over the target (and the folder fsync'd), so a reader sees the
old file or the new one, never half of one; the temporary file lives in a git-ignored ``.flashckpt-tmp/`` and
what a killed write left is removed by the next write to the folder. (Checkpoints keep their own commit protocol
in ``checkpoint/store``.) ``safe_name`` checks a name read from an input file (a profile id) before it becomes a
file name; ``read_regular_bytes`` opens only regular files. (Output folder options: ``config.preflight.check_output_folder``.)
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import threading
import time
from pathlib import Path
from typing import BinaryIO, Iterator

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


TEMP_FOLDER = ".flashckpt-tmp"  # where atomic_write's temporary files live, beside their target
_TEMP_IGNORE = "# pytest-flashckpt's temporary files (a write in progress, or one killed): never committed\n*\n"
_TEMP_NAME = re.compile(r".+\.(\d+)-\d+\.tmp")  # <target name>.<pid>-<thread id>.tmp
_STALE_AFTER_S = 3600.0  # a temporary file this old is a killed write's even if its pid was reused


@contextlib.contextmanager
def atomic_write(path: Path | str) -> Iterator[BinaryIO]:
    """``with atomic_write(path) as fh: fh.write(data)``: ``path`` is replaced only when the block succeeds.

    The temporary file is written in ``.flashckpt-tmp/`` beside ``path`` (same filesystem, so the rename is
    atomic), a folder holding a ``.gitignore`` of ``*``: a write killed with SIGKILL leaves nothing ``git status``
    shows in a committed folder such as ``baselines/``, and the next write to the folder removes what a dead
    process left (``remove_stale_temp``). The folder is removed again when nothing is left in it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a temporary name of this writer's own: two writers of one file at once never rename each other's half file
    name = f"{path.name}.{os.getpid()}-{threading.get_ident()}.tmp"
    for attempt in range(10):  # another writer may remove the (empty) temp folder between our mkdir and opens
        try:
            tmp = _temp_folder(path.parent) / name
            fh = open(tmp, "wb")
            break
        except FileNotFoundError:
            if attempt == 9:
                raise
    try:
        with fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        remove_stale_temp(path.parent)
    with contextlib.suppress(OSError):  # not every filesystem lets a folder be opened for fsync
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _temp_folder(parent: Path) -> Path:
    folder = parent / TEMP_FOLDER
    folder.mkdir(exist_ok=True)
    with contextlib.suppress(FileExistsError):
        with open(folder / ".gitignore", "x", encoding="utf-8") as fh:
            fh.write(_TEMP_IGNORE)
    return folder


def _writer_gone(tmp: Path) -> bool:
    """A temporary file ``<name>.<pid>-<thread>.tmp`` whose writing process is no longer alive (or that is older
    than any write takes)."""
    match = _TEMP_NAME.fullmatch(tmp.name)
    if match is None:  # not one of ours
        return False
    try:
        if time.time() - tmp.stat().st_mtime > _STALE_AFTER_S:
            return True
    except OSError:
        return False
    pid = int(match.group(1))
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def remove_stale_temp(folder: Path | str) -> list[Path]:
    """Remove temporary files a killed write left in ``folder`` (in its ``.flashckpt-tmp/``, and the hidden
    ``.<name>.<pid>-<thread>.tmp`` files of earlier versions beside the targets), then the temp folder itself when
    nothing else is in it. Returns what was removed. Files of live writers are left alone."""
    folder = Path(folder)
    temp = folder / TEMP_FOLDER
    candidates = [*folder.glob(".*.tmp"), *(temp.glob("*.tmp") if temp.is_dir() else ())]
    removed = []
    for tmp in candidates:
        if _writer_gone(tmp):
            with contextlib.suppress(OSError):
                tmp.unlink()
                removed.append(tmp)
    if temp.is_dir():
        with contextlib.suppress(OSError):
            if [p.name for p in temp.iterdir()] == [".gitignore"]:
                (temp / ".gitignore").unlink()
                temp.rmdir()
    return removed


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


WORK_PREFIX = "flashckpt-work-"  # a run's temporary checkpoint folders: flashckpt-work-<kind>-XXXXXXXX
_WORK_GRACE_S = 60.0  # a folder younger than this may be one whose owner has not locked it yet


@contextlib.contextmanager
def work_folder(parent: Path | str | None, kind: str) -> Iterator[Path]:
    """A temporary folder for a scenario's checkpoints (in ``parent``, default the system temp folder), removed
    when the block ends. The owner holds a ``flock`` on it while it lives: a process killed with SIGKILL loses the
    lock with its life, so the next run's ``remove_abandoned`` can tell its folder from a live run's (on any pid
    namespace sharing the folder) and remove it."""
    import fcntl
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{kind}-", dir=parent))
    fd = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
        os.close(fd)


def remove_abandoned(parent: Path | str | None) -> list[Path]:
    """Remove the ``work_folder`` folders in ``parent`` (default: the system temp folder) whose owner is gone (no
    lock held, older than a minute). Returns what was removed; a folder of a live run is left alone."""
    import fcntl
    import shutil
    import tempfile

    parent = Path(parent) if parent else Path(tempfile.gettempdir())
    removed = []
    for folder in parent.glob(f"{WORK_PREFIX}*"):
        try:
            if folder.is_symlink() or not folder.is_dir() or time.time() - folder.stat().st_mtime < _WORK_GRACE_S:
                continue
            fd = os.open(folder, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: a live run's
            os.close(fd)
            continue
        try:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        finally:
            os.close(fd)
    return removed


MAX_NAME_BYTES = 120  # NAME_MAX is 255; room left for suffixes (.json.bak) and atomic_write's .<pid>-<thread>.tmp


class UnsafeName(ValueError):
    """A name read from an input file (a profile id, a scenario id, a label) that cannot be one path component."""


def safe_name(text: object, what: str) -> str:
    """``text`` when it can be used as one file-name component inside a chosen folder, else ``UnsafeName`` saying
    why (``what`` names where it came from, e.g. ``"results.json's profile_id"``).

    Names that come from input files must never pick where a file is written: a ``/`` or a ``..`` would write
    outside the output folder, an absolute path anywhere, a control character or an overlong name fails late or
    hides in a terminal. Refused: non-text, empty, ``.``/``..``, ``/`` or ``\\``, control characters (incl.
    NUL), a leading ``-`` (read as an option by the commands that open the file), and more than
    ``MAX_NAME_BYTES`` bytes of UTF-8."""
    if not isinstance(text, str):
        raise UnsafeName(f"{what} must be a text, got {type(text).__name__} {text!r:.60}")
    problem = None
    if not text.strip():
        problem = "is empty"
    elif text in (".", ".."):
        problem = "is a relative folder name"
    elif "/" in text or "\\" in text:
        problem = "holds a path separator"
    elif any(ord(c) < 32 or ord(c) == 127 for c in text):
        problem = "holds a control character"
    elif text.startswith("-"):
        problem = "starts with '-'"
    elif len(text.encode("utf-8")) > MAX_NAME_BYTES:
        problem = f"is longer than {MAX_NAME_BYTES} bytes"
    if problem:
        raise UnsafeName(f"{what} {text!r:.80} {problem}, so it cannot name a file; fix it in the file it came from")
    return text


def read_regular_bytes(path: Path | str) -> bytes:
    """The bytes of ``path`` when it is a regular file; ``ValueError`` naming it otherwise. Checked with ``os.stat``
    before any ``open``: a FIFO named results.json would block its reader forever, a folder would raise half-way."""
    if not stat.S_ISREG(os.stat(path).st_mode):  # FileNotFoundError passes through for the caller to word
        raise ValueError(f"{path}: not a regular file (a folder, FIFO or device); name a results.json a suite run wrote")
    return Path(path).read_bytes()
