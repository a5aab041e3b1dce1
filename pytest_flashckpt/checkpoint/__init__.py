"""Checkpoint save strategies with safe commits, I/O metrics and a verified load path.

    with Checkpointer(root, SaveConfig(strategy="async", max_keep=2)) as ckpt:
        for _ in range(steps):
            trainer.train_step()
            ckpt.maybe_save(trainer)
    resume_latest(fresh_trainer, root)

Around a training loop of your own (any model, optimizer, optional scheduler, extra ``Stateful`` state):
``CheckpointManager``, ``save``, ``resume`` (module ``api``).

``run_checkpoint_pass`` is the scenario runner's entry point. Modules: ``state`` (what is saved), ``treeflat``
(nested state <-> JSON + flat tensors), ``formats`` (torch / safetensors files), ``payload`` (one checkpoint's files),
``manifest`` (sha256 list, verification), ``store`` (commit protocol, ``latest``), ``roots`` (what a root may be), ``lock`` (one writer per root),
``space`` (free space before a save, a disk that fills during one), ``rotation`` (``max_keep``),
``selection`` (``select_params``, per-block files), ``staging`` (snapshot buffers: blocking or overlapped copy),
``dcp_io`` (torch DCP), ``layouts`` (the layout axis: which files), ``scheduling`` (the schedule axis: every N steps,
memory-aware), ``strategies`` (the save composed from its three axes; a strategy name is a preset of them in
``core.registry``), ``checkpointer`` (commits, one save in flight, the fence), ``loading``, ``metrics``,
``bandwidth``, ``time_lost`` (what a save costs the training loop), ``measure``, ``export`` (model weights as a plain state dict), ``inspection``
(``flashckpt inspect``).
"""

from pytest_flashckpt.checkpoint.api import CheckpointManager, SelectiveResumeWarning, resume, save
from pytest_flashckpt.checkpoint.bandwidth import copy_bandwidth_GBps, write_bandwidth_MBps
from pytest_flashckpt.checkpoint.checkpointer import Checkpointer
from pytest_flashckpt.checkpoint.errors import (
    CheckpointError,
    CheckpointFallbackWarning,
    CorruptCheckpointError,
    DiskFullError,
    InvalidRootError,
    NoCheckpointError,
    StrictLoadError,
)
from pytest_flashckpt.checkpoint.lock import FolderLockedError
from pytest_flashckpt.checkpoint.loading import KeyReport, LoadedCheckpoint, load_blocks, load_into, load_model_tensors, read_checkpoint, resume_latest
from pytest_flashckpt.checkpoint.measure import run_checkpoint_pass
from pytest_flashckpt.checkpoint.metrics import SaveRecord
from pytest_flashckpt.checkpoint.scheduling import Deferral, process_memory
from pytest_flashckpt.checkpoint.time_lost import measure_time_lost

__all__ = [
    "CheckpointError",
    "CheckpointFallbackWarning",
    "CheckpointManager",
    "Checkpointer",
    "CorruptCheckpointError",
    "Deferral",
    "DiskFullError",
    "FolderLockedError",
    "InvalidRootError",
    "KeyReport",
    "LoadedCheckpoint",
    "NoCheckpointError",
    "SaveRecord",
    "SelectiveResumeWarning",
    "StrictLoadError",
    "copy_bandwidth_GBps",
    "load_blocks",
    "load_into",
    "load_model_tensors",
    "measure_time_lost",
    "process_memory",
    "read_checkpoint",
    "resume",
    "resume_latest",
    "run_checkpoint_pass",
    "save",
    "write_bandwidth_MBps",
]
