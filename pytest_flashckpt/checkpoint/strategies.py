"""Save strategies: small classes registered by name; the :class:`~pytest_flashckpt.checkpoint.Checkpointer` runs
whichever one ``SaveConfig.strategy`` names and owns what they share (commit protocol, one save in flight, records).

A strategy answers three questions:

* ``layout``: which files a checkpoint has and which tensor keys each holds (one file, one per block, the selected
  tensors on top of a full base, or a DCP folder); blocks and embeddings come from the model's anatomy
  (``selection``), so they work on any family, a Hugging Face model or a model with its own ``anatomy()``;
* ``begin``: what the training loop waits for at the save call; it returns a :class:`Pending` whose ``write`` the
  checkpointer runs in the caller (synchronous strategies) or in a background thread (``background``);
* ``committed``: what it remembers after a commit (the selective strategy's base).

Adding a strategy: a subclass here decorated with ``@register`` and its name in ``SaveStrategy`` of
``config/scenario.py`` (the config layer sits below this one and cannot import the registry); a suite scenario in
``suites/checkpoint.yaml`` measures it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from pytest_flashckpt.checkpoint import dcp_io, payload as payload_io
from pytest_flashckpt.checkpoint.formats import SUFFIX, fsync_path
from pytest_flashckpt.checkpoint.payload import Payload
from pytest_flashckpt.checkpoint.selection import blocks_prefix, layer_files, select_names, selective_keys
from pytest_flashckpt.checkpoint.staging import StagedCopy, StagingArea
from pytest_flashckpt.checkpoint.state import CapturedState
from pytest_flashckpt.config.scenario import SaveConfig
from pytest_flashckpt.training import Trainer

REGISTRY: dict[str, type["SaveStrategy"]] = {}


def register(cls: type["SaveStrategy"]) -> type["SaveStrategy"]:
    REGISTRY[cls.name] = cls
    return cls


def strategy_for(config: SaveConfig) -> "SaveStrategy":
    """The registered strategy ``config.strategy`` names, built for ``config``."""
    try:
        cls = REGISTRY[config.strategy]
    except KeyError:
        raise ValueError(f"SaveConfig.strategy {config.strategy!r} is not a save strategy; registered: {', '.join(sorted(REGISTRY))}") from None
    return cls(config)


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


# -- the strategies ----------------------------------------------------------------------------------------------
class SaveStrategy:
    """Base: one tensor file (or one per block with ``layer_checkpoint_dir``), written in the caller unless
    ``async_save`` asks for a staged background write."""

    name: ClassVar[str]
    summary: ClassVar[str]

    def __init__(self, config: SaveConfig) -> None:
        self.config = config

    @property
    def format(self) -> str:
        return self.config.format

    @property
    def background(self) -> bool:
        return self.config.async_save

    @property
    def overlapped(self) -> bool:
        return self.background and self.format != "dcp" and self.config.staging == "overlapped"

    def layout(self, trainer: Trainer, state: CapturedState) -> dict[str, list[str]]:
        suffix = SUFFIX[self.format]
        if self.config.layer_checkpoint_dir is not None:
            return layer_files(state, self.config.layer_checkpoint_dir, suffix, blocks_prefix(trainer.model))
        return {f"state{suffix}": list(state.tensors)}

    def base(self) -> str | None:
        return None

    def payload(self, trainer: Trainer, state: CapturedState) -> Payload:
        return Payload(state.tensors, state.tree, self.layout(trainer, state), self.format, self.base())

    def begin(self, payload: Payload, folder: Path, staging: StagingArea) -> Pending:
        """The blocking part: nothing (sync), a staging snapshot (blocking), or starting an overlapped copy."""
        if not self.background:
            return Pending(payload)
        needed = {k: payload.tensors[k] for keys in payload.files.values() for k in keys}
        t0 = time.perf_counter()
        if self.overlapped:
            copy = staging.start_copy(needed)
            return Pending(payload, copy=copy, snapshot_s=time.perf_counter() - t0)
        staged = staging.snapshot(needed)
        return Pending(replace(payload, tensors=staged), snapshot_s=time.perf_counter() - t0)

    def committed(self, name: str, payload: Payload) -> None:
        """Called after a successful commit of checkpoint ``name``."""


@register
class SyncSave(SaveStrategy):
    name = "sync"
    summary = "one file, written and committed while training waits"


@register
class AsyncSave(SaveStrategy):
    name = "async"
    summary = "snapshot into reused staging buffers (blocking copy, or overlapped with the next step), write in a background thread"

    @property
    def background(self) -> bool:
        return True


@register
class DcpSave(SaveStrategy):
    name = "dcp"
    summary = "torch.distributed.checkpoint save (async_save: torch's dcp.async_save)"

    @property
    def format(self) -> str:
        return "dcp"

    def layout(self, trainer: Trainer, state: CapturedState) -> dict[str, list[str]]:
        if self.config.layer_checkpoint_dir is not None:
            return layer_files(state, self.config.layer_checkpoint_dir, "", blocks_prefix(trainer.model))  # one DCP folder per block
        return {dcp_io.DCP_DIR: list(state.tensors)}

    def begin(self, payload: Payload, folder: Path, staging: StagingArea) -> Pending:
        if not self.background:
            return Pending(payload)
        t0 = time.perf_counter()
        future = dcp_io.async_save(dict(payload.tensors), folder / dcp_io.DCP_DIR)  # DCP stages into its own CPU copy
        return Pending(payload, future=future, snapshot_s=time.perf_counter() - t0)


@register
class SelectiveSave(SaveStrategy):
    name = "selective"
    summary = "a full base first, then only the selected parameters (select_params) and their optimizer state"

    def __init__(self, config: SaveConfig) -> None:
        super().__init__(config)
        self._base: str | None = None

    def base(self) -> str | None:
        return self._base

    def layout(self, trainer: Trainer, state: CapturedState) -> dict[str, list[str]]:
        if self._base is None:
            return super().layout(trainer, state)
        keys = selective_keys(state, select_names(trainer.model, self.config.select_params))  # type: ignore[arg-type]
        return {f"selected{SUFFIX[self.format]}": keys}

    def committed(self, name: str, payload: Payload) -> None:
        if payload.base is None:
            self._base = name


@register
class LayerwiseSave(SaveStrategy):
    name = "layerwise"
    summary = "one file per transformer block plus rest (layer_checkpoint_dir)"

    def layout(self, trainer: Trainer, state: CapturedState) -> dict[str, list[str]]:
        return layer_files(state, self.config.layer_checkpoint_dir or "layers", SUFFIX[self.format], blocks_prefix(trainer.model))


@register
class ScheduledSave(SaveStrategy):
    name = "scheduled"
    summary = "a save every save_interval steps, deferred while memory is above mem_threshold (forced after max_defer_steps)"

