"""The errors and the warnings the checkpoint package raises; each message names the file and the fix."""

from __future__ import annotations

import os
import sys

_PACKAGE = os.path.dirname(__file__) + os.sep  # as frames name their files (co_filename is __file__)


class CheckpointError(Exception):
    """A checkpoint could not be written or read (disk full, permission denied, wrong model, ...)."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint on disk fails verification: missing manifest, missing/truncated file, checksum mismatch,
    or content that is not a tensor file (for example a pickle that would run code)."""


class NoCheckpointError(CheckpointError):
    """There is no checkpoint where one was asked for: a checkpoint folder that does not exist, or
    ``resume_latest(..., required=True)`` on a root that does not exist or holds no committed checkpoint."""


class DiskFullError(CheckpointError):
    """A save needs more space than the checkpoint root's filesystem has free (refused before writing), or the disk
    filled up during the write (the half-written temporary folder removed)."""


class InvalidRootError(CheckpointError):
    """A checkpoint root that cannot be one: a file, a URL, a checkpoint folder, a ``latest`` that is not a file."""


class StrictLoadError(CheckpointError):
    """A selective or partial load found missing or unexpected keys while ``strict`` was on."""


class CheckpointFallbackWarning(UserWarning):
    """Resume skipped a checkpoint that ``latest`` (or a newer folder) named, because it failed verification,
    and used an older valid one instead."""


class SelectiveResumeWarning(UserWarning):
    """A resume took trainable parameters from a selective checkpoint's base: they are as of the base's step."""


def caller_stacklevel() -> int:
    """The ``stacklevel`` for ``warnings.warn`` called in the caller's frame that points at the first frame outside
    this package (what Python 3.12's ``skip_file_prefixes`` does), so a warning names the user's line whether it
    came through ``resume_latest`` directly or through ``CheckpointManager.resume``."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level
