"""What a checkpoint root may be: a folder on a local POSIX filesystem, holding ``ckpt-*`` folders and ``latest``.

The commit protocol (``store``) needs an atomic ``rename`` within one filesystem, fsync of files and folders, the
writer lock (``lock``: ``flock``) and ``statvfs`` for the free-space check (``space``). An fsspec-style URL
(``s3://``, ``gs://``, ``hdfs://``, ``file://``, ...) has none of these: as a ``Path`` it would silently become a
local folder named ``s3:``, so it is refused here, as is a root that is a file, a root that is itself one
checkpoint folder, and (for a writer) a ``latest`` that is not the plain file this library writes. Each refusal is
an :class:`InvalidRootError` naming the path and the fix, raised before anything is created or written.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from pytest_flashckpt.checkpoint.errors import InvalidRootError
from pytest_flashckpt.checkpoint.manifest import MANIFEST
from pytest_flashckpt.checkpoint.store import LATEST

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/")  # also what Path() leaves of one: "s3://b/x" -> "s3:/b/x"


def root_path(root: str | os.PathLike) -> Path:
    """``root`` as a local ``Path``; an fsspec-style URL is an :class:`InvalidRootError`."""
    text = os.fsdecode(os.fspath(root))
    match = _URL.match(text)
    if match:
        scheme = match.group(1)
        if scheme.lower() == "file":
            fix = f"pass the plain path {re.sub(r'^[A-Za-z]+:/+', '/', text)!r}"
        else:
            fix = (f"save to a local disk and copy the committed ckpt-* folders to {scheme}:// with your storage tool "
                   "(they are complete once 'latest' names them)")
        raise InvalidRootError(
            f"checkpoint root {text!r}: {scheme}:// URLs are not supported; a root is a folder on a local POSIX "
            f"filesystem (atomic rename, flock writer lock, free-space check); {fix}"
        )
    return Path(text)


def _kind(mode: int) -> str:
    return "folder" if stat.S_ISDIR(mode) else "symlink" if stat.S_ISLNK(mode) else "file" if stat.S_ISREG(mode) else "special file (fifo, socket or device)"


def check_root(root: str | os.PathLike, *, writing: bool) -> Path:
    """``root`` as a ``Path`` after checking it can be a checkpoint root; ``writing``: also that ``latest`` is a
    plain file and no parent of a root still to be created is a file. A missing root is fine (nothing saved yet)."""
    path = root_path(root)
    try:
        st = path.stat()
    except FileNotFoundError:
        st = None
    except NotADirectoryError:  # a parent is a file
        st = None
    except OSError as exc:
        raise InvalidRootError(f"checkpoint root {path}: cannot be read ({exc.strerror}); choose another checkpoint folder") from None
    if st is None:
        if writing:
            parent = next((p for p in path.parents if p.exists()), None)
            if parent is not None and not parent.is_dir():
                raise InvalidRootError(f"checkpoint root {path}: {parent} is a {_kind(parent.stat().st_mode)}, not a folder, so the root cannot be created there; choose a root whose parents are folders")
        return path
    if not stat.S_ISDIR(st.st_mode):
        raise InvalidRootError(
            f"checkpoint root {path} is a {_kind(st.st_mode)}, not a folder; pass the folder that holds (or will hold) the "
            f"checkpoints, e.g. {path.parent / (path.name + '-ckpt')}, or move {path} away"
        )
    if (path / MANIFEST).is_file():
        raise InvalidRootError(
            f"checkpoint root {path} is one checkpoint (it holds {MANIFEST}), not a root of checkpoints; pass its parent "
            f"{path.parent} as the root (or load this one checkpoint with load_into(trainer, {str(path)!r}))"
        )
    if writing:
        pointer = path / LATEST
        try:
            mode = pointer.lstat().st_mode
        except FileNotFoundError:
            return path
        if not stat.S_ISREG(mode):
            raise InvalidRootError(
                f"{pointer} is a {_kind(mode)}, not the pointer file this library writes there (one line naming a "
                f"checkpoint folder); move it away or delete it (resume then uses the newest complete checkpoint)"
            )
    return path
