"""A save strategy is a preset of three axes, not a class. Its name is a key of ``core.registry.SAVE_PRESETS``
(with the preset's layout, staging and schedule), or for axes no preset names one derived from them
(``registry.derived_save_name``); ``config.save_axes`` resolves a scenario's settings into ``SaveConfig.strategy``
(the name) and ``SaveConfig.axes``. In this package the name only chooses whether to save at all (``none``) and
is otherwise recorded: in each ``SaveRecord``, each checkpoint's ``meta.json`` and ``manifest.json``, and so in the
results a report reads. This module
composes the save from ``SaveConfig.axes`` for the :class:`~pytest_flashckpt.checkpoint.Checkpointer`, which owns
what every save shares (commit protocol, one save in flight, records, the schedule).

* layout (``layouts``): which files a checkpoint has and which tensor keys each holds;
* staging (here, :meth:`SavePlan.begin`): what the training loop waits for at the save call. ``blocking``: nothing
  at the call, the checkpointer writes in the caller; ``background``: a snapshot into reused staging buffers (the
  dcp layout: ``dcp.async_save``, which stages into its own copy), written by a background thread; ``overlapped``:
  the copy into the buffers runs during the next step, the write after it;
* schedule (``scheduling.schedule_for``): when a save is taken.

Adding a preset is a row in ``SAVE_PRESETS``; a new axis value is its entry in the axis table there
(``SAVE_LAYOUTS``, ``SAVE_STAGINGS``, ``SAVE_SCHEDULES``) and its implementation here, in ``layouts`` or in
``scheduling`` (docs/architecture.md, "A save strategy").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from pytest_flashckpt.checkpoint import dcp_io, payload as payload_io
from pytest_flashckpt.checkpoint.formats import fsync_path
from pytest_flashckpt.checkpoint.layouts import Layout, layout_for
from pytest_flashckpt.checkpoint.payload import Payload
from pytest_flashckpt.checkpoint.staging import StagedCopy, StagingArea
from pytest_flashckpt.checkpoint.state import CapturedState
from pytest_flashckpt.config.scenario import SaveConfig
from pytest_flashckpt.training import Trainer


# -- what the training loop hands to the writer ------------------------------------------------------------------
@dataclass
class Pending:
    """A save after its blocking part: ``write(folder)`` writes the tensor files (and returns the payload written);
    ``fence(keys)`` orders in-place changes of live tensors after their staging (a no-op unless overlapped)."""

    payload: Payload
    copy: StagedCopy | None = None
    future: object | None = None  # DCP async_save's future
    snapshot_s: float = 0.0

    def fence(self, keys=None) -> float:
        return self.copy.fence(keys) if self.copy is not None else 0.0

    def write(self, folder: Path) -> Payload:
        payload = self.payload
        if self.future is not None:
            self.future.result()  # type: ignore[attr-defined]
            for f in (folder / dcp_io.DCP_DIR).rglob("*"):
                if f.is_file():
                    fsync_path(f)
            return payload
        if self.copy is not None:
            payload = replace(payload, tensors=self.copy.result())
        payload_io.write_tensors(folder, payload)
        return payload


# -- the save composed from its axes ------------------------------------------------------------------------------
class SavePlan:
    """One run's save: ``config.axes``'s layout (an object: the selected layout remembers its base) and staging."""

    def __init__(self, config: SaveConfig) -> None:
        self.config = config
        self.layout: Layout = layout_for(config)

    @property
    def format(self) -> str:
        return self.layout.format

    @property
    def background(self) -> bool:
        return self.config.axes.background

    @property
    def overlapped(self) -> bool:
        return self.config.axes.overlapped

    def payload(self, trainer: Trainer, state: CapturedState) -> Payload:
        return Payload(state.tensors, state.tree, self.layout.files(trainer, state), self.format, self.layout.base())

    def begin(self, payload: Payload, folder: Path, area: StagingArea) -> Pending:
        """The blocking part: nothing (blocking), a snapshot (background), or starting an overlapped copy."""
        if not self.background:
            return Pending(payload)
        if self.format == "dcp":
            t0 = time.perf_counter()
            future = dcp_io.async_save(dict(payload.tensors), folder / dcp_io.DCP_DIR)  # DCP stages into its own CPU copy
            return Pending(payload, future=future, snapshot_s=time.perf_counter() - t0)
        needed = {k: payload.tensors[k] for keys in payload.files.values() for k in keys}
        t0 = time.perf_counter()
        if self.overlapped:
            copy = area.start_copy(needed)
            return Pending(payload, copy=copy, snapshot_s=time.perf_counter() - t0)
        staged = area.snapshot(needed)
        return Pending(replace(payload, tensors=staged), snapshot_s=time.perf_counter() - t0)

    def committed(self, name: str, payload: Payload) -> None:
        self.layout.committed(name, payload)
