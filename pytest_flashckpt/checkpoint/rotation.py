"""``max_keep`` rotation: which committed checkpoints to delete.

Kept: the newest ``max_keep`` complete checkpoints, the one ``latest`` names, and every base a kept selective
checkpoint is restored on top of. The newest complete checkpoint is therefore never deleted; a save still in flight
lives in a temporary folder and is not counted until it commits.
"""

from __future__ import annotations

from pathlib import Path

from pytest_flashckpt.checkpoint.errors import CheckpointError
from pytest_flashckpt.checkpoint.manifest import read_manifest
from pytest_flashckpt.checkpoint.store import CheckpointStore


def to_delete(store: CheckpointStore, max_keep: int | None) -> list[Path]:
    complete = store.complete()
    if max_keep is None or len(complete) <= max_keep:
        return []
    keep = {p.name for p in complete[-max_keep:]}
    latest = store.latest_name()
    if latest:
        keep.add(latest)
    pending = list(keep)
    while pending:  # bases of kept selective checkpoints, transitively
        name = pending.pop()
        try:
            base = read_manifest(store.root / name).base
        except CheckpointError:
            continue
        if base and base not in keep:
            keep.add(base)
            pending.append(base)
    return [p for p in complete if p.name not in keep]


def rotate(store: CheckpointStore, max_keep: int | None) -> list[Path]:
    """Delete what :func:`to_delete` selects; returns the deleted folders."""
    doomed = to_delete(store, max_keep)
    for folder in doomed:
        store.delete(folder)
    return doomed
