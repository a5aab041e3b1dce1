"""The checkpointer: one object per run that saves a ``Trainer`` with the strategy a ``SaveConfig`` names.

Strategies compose three independent choices, all read from ``SaveConfig``:

* layout: one file (``sync``/``async``/``scheduled``), one file per block + ``rest`` (``layerwise``, or any strategy
  with ``layer_checkpoint_dir``), selected tensors on top of a full base (``selective``), or DCP (``dcp``);
* writing: in the caller (sync) or in a background thread after a snapshot into a reusable staging area
  (``async``, ``async_save: true``; for ``dcp`` torch's ``dcp.async_save``); at most one save is in flight and a
  background failure is raised by the next call or by ``close()``;
* when: every ``save_interval`` steps, deferred while memory is above ``mem_threshold`` (``scheduled``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from concurrent.futures import Future
from pathlib import Path

from pytest_flashckpt.checkpoint import dcp_io, payload as payload_io
from pytest_flashckpt.checkpoint.errors import CheckpointError
from pytest_flashckpt.checkpoint.formats import SUFFIX, fsync_path
from pytest_flashckpt.checkpoint.manifest import Manifest, write_manifest
from pytest_flashckpt.checkpoint.metrics import SaveRecord
from pytest_flashckpt.checkpoint.payload import Payload
from pytest_flashckpt.checkpoint.rotation import rotate
from pytest_flashckpt.checkpoint.scheduling import MemoryGauge, SaveSchedule, process_memory
from pytest_flashckpt.checkpoint.selection import layer_files, select_names, selective_keys
from pytest_flashckpt.checkpoint.staging import StagingArea
from pytest_flashckpt.checkpoint.state import CapturedState, capture
from pytest_flashckpt.checkpoint.store import CheckpointStore, describe_os_error
from pytest_flashckpt.config.scenario import SaveConfig
from pytest_flashckpt.training import Trainer


class Checkpointer:
    """Saves a trainer into ``root`` per ``config``; use as a context manager or call ``close()``.

    ``probe`` (a memory probe) measures the transient memory of the blocking part of the first ``probe_saves``
    saves only: it is the same tensors every time, and a dispatch mode would inflate the stall of every save."""

    def __init__(self, root: Path, config: SaveConfig, probe=None, gauge: MemoryGauge = process_memory, probe_saves: int = 1) -> None:
        if config.strategy == "none":
            raise ValueError("SaveConfig.strategy is 'none'; name a save strategy (sync, async, dcp, selective, layerwise, scheduled)")
        self.config = config
        self.store = CheckpointStore(Path(root))
        self.probe = probe
        self.probe_saves = probe_saves
        self._transient_peak = 0
        self.records: list[SaveRecord] = []
        self.schedule = SaveSchedule(config.save_interval, config.mem_threshold, config.max_defer_steps, gauge)
        self.background = config.strategy == "async" or config.async_save
        self.staging = StagingArea()
        self._base: str | None = None  # selective: the full checkpoint later saves are restored on top of
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._lock = threading.Lock()
        self._dcp_group = contextlib.ExitStack()
        if config.strategy == "dcp":
            self._dcp_group.enter_context(dcp_io.process_group())

    # -- public API -------------------------------------------------------------------------------------------
    def maybe_save(self, trainer: Trainer) -> SaveRecord | None:
        """Call after every training step: saves when the schedule says so (interval, memory threshold)."""
        self._raise_background_failure()
        if not self.schedule.should_save(trainer.step):
            return None
        record = self.save(trainer)
        record.forced = bool(self.schedule.forced and self.schedule.forced[-1] == trainer.step)
        return record

    def save(self, trainer: Trainer) -> SaveRecord:
        """Save now. Returns when training may continue (sync: committed; async: snapshot taken)."""
        start = time.perf_counter()
        self.wait()
        waited = time.perf_counter() - start
        state = capture(trainer)
        name = self.store.reserve_name(trainer.step)
        record = SaveRecord(trainer.step, name, self.config.strategy, wait_s=waited, snapshot_bytes=state.nbytes)
        tmp = self.store.begin(name)
        self.records.append(record)
        staged_before = self.staging.nbytes
        try:
            with self._track(trainer) as reading:
                work = self._prepare(trainer, state, tmp, record)
        except BaseException:
            self.store.abort(tmp)
            raise
        if reading is not None:
            grown = 0 if state.on_device else self.staging.nbytes - staged_before  # counted exactly below
            self._transient_peak = max(self._transient_peak, reading.added_peak_bytes - grown)
        staged_here = 0 if state.on_device else self.staging.nbytes  # GPU state: pinned host staging is not device memory
        record.save_extra_peak_bytes = staged_here + max(self._transient_peak, 0)
        if self.background:
            record.save_stall_s = time.perf_counter() - start
            self._thread = threading.Thread(target=self._background, args=(work, tmp, record, start), name=f"flashckpt-save-{name}", daemon=True)
            self._thread.start()
        else:
            self._finish(work, tmp, record, start)
            record.save_stall_s = time.perf_counter() - start
        return record

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed; raises its failure, once."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise_background_failure()

    def close(self) -> None:
        """Wait for the save in flight and release the DCP process group; raises a pending background failure."""
        try:
            self.wait()
        finally:
            self._dcp_group.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------------------------
    def _track(self, trainer: Trainer):
        if self.probe is None or len(self.records) > self.probe_saves:  # records already holds this save
            return contextlib.nullcontext(None)
        return self.probe.track(resident=[*trainer.state_tensors(), *self.staging._buffers.values()])

    def _payload(self, trainer: Trainer, state: CapturedState) -> Payload:
        cfg = self.config
        fmt = "dcp" if cfg.strategy == "dcp" else cfg.format
        suffix = "" if fmt == "dcp" else SUFFIX[fmt]
        if cfg.strategy == "selective" and self._base is not None:
            keys = selective_keys(state, select_names(trainer.model, cfg.select_params))  # type: ignore[arg-type]
            files = {f"selected{suffix}": keys}
        elif cfg.strategy == "layerwise" or cfg.layer_checkpoint_dir is not None:
            files = layer_files(state, cfg.layer_checkpoint_dir or "layers", suffix)
        else:
            files = {"dcp" if fmt == "dcp" else f"state{suffix}": list(state.tensors)}
        base = self._base if cfg.strategy == "selective" else None
        return Payload(state.tensors, state.tree, files, fmt, base)

    def _prepare(self, trainer: Trainer, state: CapturedState, tmp: Path, record: SaveRecord):
        """The part the training loop waits for: sync writes everything; async snapshots into staging."""
        payload = self._payload(trainer, state)
        record.base = payload.base
        if not self.background:
            return payload
        t0 = time.perf_counter()
        needed = {k for keys in payload.files.values() for k in keys}
        if payload.format == "dcp":
            staged_tensors = {k: payload.tensors[k] for k in needed}
            future = dcp_io.async_save(staged_tensors, tmp / "dcp")  # DCP stages into its own CPU copy
            record.snapshot_s = time.perf_counter() - t0
            return (payload, future)
        staged = self.staging.snapshot({k: payload.tensors[k] for k in needed})
        record.snapshot_s = time.perf_counter() - t0
        return dataclasses.replace(payload, tensors=staged)

    def _finish(self, work, tmp: Path, record: SaveRecord, start: float) -> None:
        """Write (unless DCP already is), manifest, commit, rotate; aborts the temporary folder on any failure."""
        cfg = self.config
        try:
            t0 = time.perf_counter()
            if isinstance(work, tuple):
                payload, future = work
                future.result()
                for f in (tmp / "dcp").rglob("*"):
                    if f.is_file():
                        fsync_path(f)
            else:
                payload = work
                payload_io.write_tensors(tmp, payload)
            payload_io.write_meta(tmp, payload, record.step, cfg.strategy)
            record.write_s = time.perf_counter() - t0
            manifest = Manifest(record.name, record.step, cfg.strategy, payload.format, dataclasses.asdict(cfg), base=payload.base)
            manifest_bytes = write_manifest(tmp, manifest)
            record.bytes_written = manifest.bytes + manifest_bytes
            record.files = len(manifest.files) + 1
            with self._lock:
                self.store.commit(tmp, record.name)
                if cfg.strategy == "selective" and payload.base is None:
                    self._base = record.name
                rotate(self.store, cfg.max_keep)
        except OSError as exc:
            self.store.abort(tmp)
            record.error = describe_os_error(exc, self.store.root)
            raise CheckpointError(f"save of step {record.step} into {self.store.root} failed: {record.error}; "
                                  f"no partial checkpoint was published, the previous one is intact") from exc
        except BaseException as exc:
            self.store.abort(tmp)
            record.error = f"{type(exc).__name__}: {exc}"
            raise
        record.save_total_s = time.perf_counter() - start
        record.done = True

    def _background(self, work, tmp: Path, record: SaveRecord, start: float) -> None:
        try:
            self._finish(work, tmp, record, start)
        except BaseException as exc:  # surfaced by the next call or close()
            self._failure = exc

    def _raise_background_failure(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise CheckpointError(f"a background checkpoint save failed: {failure}") from failure
