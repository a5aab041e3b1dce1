"""The errors and the warning the checkpoint package raises; each message names the file and the fix."""

from __future__ import annotations


class CheckpointError(Exception):
    """A checkpoint could not be written or read (disk full, permission denied, wrong model, ...)."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint on disk fails verification: missing manifest, missing/truncated file, checksum mismatch,
    or content that is not a tensor file (for example a pickle that would run code)."""


class NoCheckpointError(CheckpointError):
    """There is no checkpoint where one was asked for: a checkpoint folder that does not exist, or
    ``resume_latest(..., required=True)`` on a root that does not exist or holds no committed checkpoint."""


class StrictLoadError(CheckpointError):
    """A selective or partial load found missing or unexpected keys while ``strict`` was on."""


class CheckpointFallbackWarning(UserWarning):
    """Resume skipped a checkpoint that ``latest`` (or a newer folder) named, because it failed verification,
    and used an older valid one instead."""
