"""The checkpoint library around a user's own training loop: save and resume any model, optimizer, optional LR
scheduler and extra state, with every save strategy, no wrapper around the model.

    from pytest_flashckpt.checkpoint import CheckpointManager

    ckpt = CheckpointManager("runs/ckpt", model=model, optimizer=opt, extra={"loader": loader}, strategy="async")
    start = ckpt.resume() or 0           # None: no checkpoint yet, start from scratch
    for step in range(start, steps):
        train_one_step(...)
        ckpt.maybe_save(step + 1)        # every save_interval steps (scheduled: while memory allows)
    ckpt.close()                         # waits for the save in flight (or use ``with``)

``extra`` holds anything with ``state_dict()`` and ``load_state_dict()`` (the ``Stateful`` protocol that
``torch.distributed.checkpoint`` uses): a data loader's position, a sampler, a counter. Its state is taken when the
save is called, tensors and plain values (numbers, strings, lists, dicts) only. Every RNG stream (torch, CUDA, python,
numpy) is saved and restored too, so a resumed loop continues bitwise where an uninterrupted one would be.

Strategies and their options are the suites' (``SaveConfig``): ``sync``, ``async`` (``staging="overlapped"`` waits
for the copy before the optimizer's next ``step()``; change any other saved tensor in place only after
:meth:`CheckpointManager.fence`), ``dcp``, ``selective`` (``select_params``; its first save is the full base, later
ones hold the selection; parameters left out come back from the base: frozen ones are exact, trained ones are not
and a resume warns (:class:`SelectiveResumeWarning`)), ``layerwise`` (one file per block of the model's anatomy),
``scheduled`` (``save_interval`` + ``mem_threshold``); each is a preset of three axes that ``layout``, ``staging``
and ``schedule`` also set one by one (docs/checkpoints.md, "Axes and presets"). The one-call :func:`save` and :func:`resume` build a manager
for one save or one resume; a selective run keeps one manager, which remembers its base.

A manager is its root's one writer: it takes the root's writer lock when it is built (``checkpoint.lock``; a second
manager or process on the same root is refused there, before training starts) and frees it at :meth:`close`; the
one-call :func:`resume` only reads and takes no lock. The root must be a local folder (``checkpoint.roots``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.nn as nn

from pytest_flashckpt.checkpoint.checkpointer import Checkpointer
from pytest_flashckpt.checkpoint.errors import SelectiveResumeWarning
from pytest_flashckpt.checkpoint.loading import resume_latest
from pytest_flashckpt.checkpoint.lock import WriterLock
from pytest_flashckpt.checkpoint.metrics import SaveRecord
from pytest_flashckpt.checkpoint.roots import check_root
from pytest_flashckpt.checkpoint.state import Stateful, check_stateful
from pytest_flashckpt.config.scenario import MEASUREMENT_ONLY_SAVE_KEYS, SaveConfig
from pytest_flashckpt.core.registry import NO_SAVE, SAVE_PRESETS

__all__ = ["CheckpointManager", "SelectiveResumeWarning", "Stateful", "resume", "save"]


@dataclass
class LoopState:
    """A user's loop as the checkpointer sees it (what a ``Trainer`` offers): references, never copies."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    step: int = 0

    def state_tensors(self) -> list[torch.Tensor]:
        """Every tensor the training state keeps alive between steps (parameters, buffers, optimizer state)."""
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        for state in self.optimizer.state.values():
            tensors.extend(v for v in state.values() if isinstance(v, torch.Tensor))
        return tensors


def _config(strategy: str, options: Mapping[str, Any]) -> SaveConfig:
    fields = {f.name for f in dataclasses.fields(SaveConfig) if f.init} - {"strategy", *MEASUREMENT_ONLY_SAVE_KEYS}
    unknown = sorted(set(options) - fields)
    if unknown:
        measuring = [k for k in unknown if k in MEASUREMENT_ONLY_SAVE_KEYS]
        why = f" ({', '.join(measuring)}: how a suite's checkpoint pass measures saves, not a save option)" if measuring else ""
        raise TypeError(f"unknown save option(s) {', '.join(unknown)}{why}; valid: {', '.join(sorted(fields))}")
    if strategy == NO_SAVE:
        raise ValueError(f"strategy 'none' saves nothing; name a save strategy ({', '.join(SAVE_PRESETS)})")
    return SaveConfig(strategy=strategy, **options)  # type: ignore[arg-type]


class CheckpointManager:
    """Saves ``model``, ``optimizer``, ``scheduler`` (optional) and ``extra`` state under ``root`` with ``strategy``
    and resumes them; ``options`` are ``SaveConfig``'s (``format``, ``max_keep``, ``save_interval``,
    ``select_params``, ``mem_threshold``, ``staging``, ``layer_checkpoint_dir``, ...). Use as a context manager or
    call :meth:`close`. Built, it holds ``root``'s writer lock until :meth:`close` (``FolderLockedError`` if
    another writer holds it)."""

    def __init__(
        self,
        root: str | Path,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any = None,
        extra: Mapping[str, Stateful] | None = None,
        strategy: str = "sync",
        **options: Any,
    ) -> None:
        self.loop = _loop(model, optimizer, scheduler, extra)
        self.config = _config(strategy, options)
        self.root = check_root(root, writing=True)
        self._writer_lock = WriterLock(self.root).acquire()
        self._checkpointer: Checkpointer | None = None

    @property
    def checkpointer(self) -> Checkpointer:
        """The underlying checkpointer (started at the first save: a resume-only manager starts no writer thread)."""
        if self._checkpointer is None:
            self._checkpointer = Checkpointer(self.root, self.config, lock=self._writer_lock)
        return self._checkpointer

    @property
    def records(self) -> list[SaveRecord]:
        """One record per save made so far (stall, total time, bytes, files)."""
        return [] if self._checkpointer is None else self._checkpointer.records

    def save(self, step: int) -> SaveRecord:
        """Save now as step ``step`` (what :meth:`resume` returns). Returns when the loop may go on: sync and
        selective/layerwise when committed, async/dcp-async once the state is staged."""
        self.loop.step = _step(step)
        return self.checkpointer.save(self.loop)

    def maybe_save(self, step: int) -> SaveRecord | None:
        """Call after every step with the number of steps done: saves every ``save_interval`` steps (``scheduled``:
        deferred while memory is above ``mem_threshold``, forced after ``max_defer_steps``)."""
        self.loop.step = _step(step)
        return self.checkpointer.maybe_save(self.loop)

    def resume(self, *, required: bool = False) -> int | None:
        """Restore the newest valid checkpoint under ``root`` into the model, optimizer, scheduler, extra state and
        RNG streams; returns its step, or None when there is none yet (``required=True``: ``NoCheckpointError``).
        Waits for a save of this manager still in flight first."""
        if self._checkpointer is not None:
            self._checkpointer.wait()
        return _resume(self.loop, self.root, required)

    def fence(self, *tensors: torch.Tensor) -> float:
        """Before changing a saved tensor in place outside ``optimizer.step()`` (overlapped staging only)."""
        return 0.0 if self._checkpointer is None else self._checkpointer.fence(*tensors)

    def wait(self) -> None:
        """Block until the save in flight is committed (raises its failure)."""
        if self._checkpointer is not None:
            self._checkpointer.wait()

    def close(self) -> None:
        """Wait for the save in flight (raising its failure) and free the root's writer lock."""
        try:
            if self._checkpointer is not None:
                self._checkpointer.close()
        finally:
            self._writer_lock.release()

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def save(
    root: str | Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    scheduler: Any = None,
    extra: Mapping[str, Stateful] | None = None,
    strategy: str = "sync",
    **options: Any,
) -> SaveRecord:
    """One save of the given state as step ``step``, committed when this returns (a background strategy is waited
    for). A selective save made this way is always a full base: keep a :class:`CheckpointManager` instead."""
    with CheckpointManager(root, model=model, optimizer=optimizer, scheduler=scheduler, extra=extra, strategy=strategy, **options) as manager:
        return manager.save(step)


def resume(
    root: str | Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    extra: Mapping[str, Stateful] | None = None,
    required: bool = False,
) -> int | None:
    """Restore the newest valid checkpoint under ``root`` (any strategy); its step, or None when there is none. Only
    reads: no writer lock, so it works beside a run that is saving there."""
    return _resume(_loop(model, optimizer, scheduler, extra), root, required)


def _loop(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, extra: Mapping[str, Stateful] | None) -> LoopState:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    return LoopState(model, optimizer, scheduler, check_stateful(extra or {}))


def _resume(loop: LoopState, root: str | Path, required: bool) -> int | None:
    """What :meth:`CheckpointManager.resume` and :func:`resume` share: ``resume_latest`` (which warns on trainable
    parameters a selective checkpoint left to its base) and the step it restored."""
    return None if resume_latest(loop, root, required=required) is None else loop.step


def _step(step: int) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int (steps done so far), got {step!r}")
    return step

