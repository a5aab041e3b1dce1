"""The writer lock of a checkpoint folder, shared with the single-process checkpointer: it lives in
``checkpoint.lock`` (the layer both import), re-exported here for the sharded store."""

from __future__ import annotations

from pytest_flashckpt.checkpoint.lock import LOCK_FILE, FolderLockedError, WriterLock

__all__ = ["LOCK_FILE", "FolderLockedError", "WriterLock"]
