"""The checkpointer: one object per run that saves a ``Trainer`` as a ``SaveConfig``'s axes say.

Anything shaped like a ``Trainer`` will do (``state.Checkpointable``: model, optimizer, optional scheduler, step,
``state_tensors()``, optional ``extra``); ``checkpoint.api`` hands in a user's own loop that way.

The save is composed from the config's three axes: the layout and the blocking part of the staging in
``strategies.SavePlan`` (``self.plan``), the schedule from ``scheduling.schedule_for`` (``self.schedule``: every
``save_interval`` steps, memory-aware: deferred while memory is above ``mem_threshold``). The checkpointer owns what
every save shares: the commit protocol, at most one save in flight (a background failure is raised by the next
call or by ``close()``), the fence of an overlapped copy, and the per-save records. It is the root's one writer:
it holds the root's writer lock (``lock``) from construction to ``close()``, and it refuses a save the disk has no
room for before writing it (``space``).

Overlapped staging (``staging: overlapped``, e.g. ``async`` with it): ``save`` returns right after capturing the state; the copy
into the staging buffers runs during the next forward and backward. The checkpointer registers a step pre-hook on
the trainer's optimizer that waits for the copy before ``optimizer.step()`` changes parameters and optimizer state;
any other in-place change of a saved tensor must call :meth:`Checkpointer.fence` first (non-tensor state, e.g. the LR
scheduler's, is captured by value at the save call).
"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from pytest_flashckpt.checkpoint import dcp_io, payload as payload_io
from pytest_flashckpt.checkpoint.errors import CheckpointError, DiskFullError
from pytest_flashckpt.checkpoint.lock import WriterLock
from pytest_flashckpt.checkpoint.manifest import Manifest, write_manifest
from pytest_flashckpt.checkpoint.metrics import SaveRecord
from pytest_flashckpt.checkpoint.roots import check_root
from pytest_flashckpt.checkpoint.rotation import rotate
from pytest_flashckpt.checkpoint.scheduling import MemoryGauge, process_memory, schedule_for
from pytest_flashckpt.checkpoint.space import bytes_needed, check_free_space, disk_full_during_write
from pytest_flashckpt.checkpoint.staging import StagingArea
from pytest_flashckpt.checkpoint.state import capture
from pytest_flashckpt.checkpoint.store import CheckpointStore, describe_os_error
from pytest_flashckpt.checkpoint.strategies import Pending, SavePlan
from pytest_flashckpt.config.scenario import SaveConfig
from pytest_flashckpt.core.registry import NO_SAVE, SAVE_PRESETS
from pytest_flashckpt.training import Trainer


class Checkpointer:
    """Saves a trainer into ``root`` per ``config``; use as a context manager or call ``close()``.

    ``probe`` (a memory probe) measures the transient memory of the blocking part of the first ``probe_saves``
    saves only: it is the same tensors every time, and a dispatch mode would inflate the stall of every save.

    ``lock``: the root's writer lock when the caller took it already (``CheckpointManager`` takes it when it is
    built); the checkpointer owns it from here and releases it at ``close()``."""

    def __init__(self, root: Path, config: SaveConfig, probe=None, gauge: MemoryGauge = process_memory, probe_saves: int = 1,
                 lock: WriterLock | None = None) -> None:
        if config.strategy == NO_SAVE:
            raise ValueError(f"SaveConfig.strategy is 'none'; name a save strategy ({', '.join(SAVE_PRESETS)}) or set its axes")
        root = check_root(root, writing=True)
        self.writer_lock = (lock or WriterLock(root)).acquire()
        try:
            self._start(root, config, probe, gauge, probe_saves)
        except BaseException:
            self.writer_lock.release()
            raise

    def _start(self, root: Path, config: SaveConfig, probe, gauge: MemoryGauge, probe_saves: int) -> None:
        self.config = config
        self.plan = SavePlan(config)
        self.store = CheckpointStore(root)
        self.probe = probe
        self.probe_saves = probe_saves
        self._transient_peak = 0
        self.records: list[SaveRecord] = []
        self.schedule = schedule_for(config, gauge)
        self.background = self.plan.background
        self.overlapped = self.plan.overlapped
        self.staging = StagingArea()
        self._writer: ThreadPoolExecutor | None = None  # one background writer thread, started here (see warm())
        self._in_flight: Future | None = None
        self._failure: BaseException | None = None
        self._lock = threading.Lock()
        self._pending: Pending | None = None  # the save whose overlapped copy may still be running
        self._pending_record: SaveRecord | None = None
        self._hooks: dict[int, object] = {}  # id(optimizer) -> step pre-hook handle
        self._dcp_group = contextlib.ExitStack()
        if self.plan.format == "dcp":
            self._dcp_group.enter_context(dcp_io.process_group())
        if self.background:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="flashckpt-save")
            self._writer.submit(lambda: None).result()  # a thread start waits until it runs: paid here, not per save
            if self.overlapped:
                self.staging.warm()

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
        """Save now. Returns when training may continue (sync: committed; async: snapshot taken; overlapped: state
        captured, the copy runs on and the optimizer's next step waits for it)."""
        start = time.perf_counter()
        self.wait()
        waited = time.perf_counter() - start
        state = capture(trainer)
        payload = self.plan.payload(trainer, state)
        needed = bytes_needed(payload)
        check_free_space(self.store.root, needed, f"save of step {trainer.step} into {self.store.root}")
        name = self.store.reserve_name(trainer.step)
        record = SaveRecord(trainer.step, name, self.config.strategy, wait_s=waited, snapshot_bytes=state.nbytes)
        tmp = self.store.begin(name)
        self.records.append(record)
        staged_before = self.staging.nbytes
        try:
            with self._track(trainer) as reading:
                record.base = payload.base
                pending = self.plan.begin(payload, tmp, self.staging)
                record.snapshot_s = pending.snapshot_s
        except BaseException:
            self.store.abort(tmp)
            raise
        if reading is not None:
            grown = 0 if state.on_device else self.staging.nbytes - staged_before  # counted exactly below
            self._transient_peak = max(self._transient_peak, reading.added_peak_bytes - grown)
        staged_here = 0 if state.on_device else self.staging.nbytes  # GPU state: pinned host staging is not device memory
        record.save_extra_peak_bytes = staged_here + max(self._transient_peak, 0)
        if pending.copy is not None:
            self._pending, self._pending_record = pending, record
            self._hook(trainer.optimizer)
        if self.background:
            record.save_stall_s = time.perf_counter() - start
            self._in_flight = self._writer.submit(self._background, pending, tmp, record, start, needed)  # type: ignore[union-attr]
        else:
            self._finish(pending, tmp, record, start, needed)
            record.save_stall_s = time.perf_counter() - start
        return record

    def fence(self, *tensors: torch.Tensor) -> float:
        """Wait until an overlapped copy has staged ``tensors`` (all saved tensors when none are named), so they may
        be changed in place; returns the seconds waited (added to the save's stall). A no-op otherwise."""
        pending, record = self._pending, self._pending_record
        if pending is None or pending.copy is None:
            return 0.0
        if tensors:
            ids = {id(t) for t in tensors}
            ptrs = {(t.untyped_storage().data_ptr(), t.storage_offset()) for t in tensors}
            keys = [k for k, t in pending.payload.tensors.items() if id(t) in ids or (t.untyped_storage().data_ptr(), t.storage_offset()) in ptrs]
        else:
            keys = None
        waited = pending.fence(keys)
        if record is not None:
            record.fence_wait_s += waited
            record.save_stall_s += waited
        if keys is None:
            self._pending = self._pending_record = None
        return waited

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed; raises its failure, once."""
        if self._in_flight is not None:
            self._in_flight.result()  # _background keeps the failure for the check below
            self._in_flight = None
        self._pending = self._pending_record = None
        self._raise_background_failure()

    def close(self) -> None:
        """Wait for the save in flight, remove the optimizer hooks, release the DCP process group and the root's
        writer lock; raises a pending background failure."""
        try:
            self.wait()
        finally:
            try:
                for handle in self._hooks.values():
                    handle.remove()  # type: ignore[attr-defined]
                self._hooks.clear()
                if self._writer is not None:
                    self._writer.shutdown(wait=True)
                self._dcp_group.close()
            finally:
                self.writer_lock.release()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------------------------
    def _hook(self, optimizer: torch.optim.Optimizer) -> None:
        """Fence before every ``optimizer.step()`` of this trainer (registered once; a no-op without a copy in flight)."""
        if id(optimizer) not in self._hooks:
            self._hooks[id(optimizer)] = optimizer.register_step_pre_hook(self._step_pre_hook)

    def _step_pre_hook(self, optimizer, args, kwargs) -> None:
        self.fence()

    def _track(self, trainer: Trainer):
        if self.probe is None or len(self.records) > self.probe_saves:  # records already holds this save
            return contextlib.nullcontext(None)
        return self.probe.track(resident=[*trainer.state_tensors(), *self.staging.buffers()])

    def _finish(self, pending: Pending, tmp: Path, record: SaveRecord, start: float, needed: int) -> None:
        """Write, manifest, commit, rotate; aborts the temporary folder on any failure (``needed``: the save's bytes,
        to tell a disk that filled up from other failures)."""
        cfg = self.config
        try:
            t0 = time.perf_counter()
            payload = pending.write(tmp)
            payload_io.write_meta(tmp, payload, record.step, cfg.strategy)
            record.write_s = time.perf_counter() - t0
            manifest = Manifest(record.name, record.step, cfg.strategy, payload.format, cfg.recorded(), base=payload.base)
            manifest_bytes = write_manifest(tmp, manifest)
            record.bytes_written = manifest.bytes + manifest_bytes
            record.files = len(manifest.files) + 1
            with self._lock:
                self.store.commit(tmp, record.name)
                self.plan.committed(record.name, payload)
                rotate(self.store, cfg.max_keep)
        except (KeyboardInterrupt, SystemExit):
            self.store.abort(tmp)
            raise
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            full = disk_full_during_write(exc, tmp, needed)  # before the abort: tmp holds what was written
            self.store.abort(tmp)
            if full is not None:
                record.error = full
                raise DiskFullError(f"save of step {record.step} into {self.store.root} failed: {full}; the half-written "
                                    f"{tmp.name} was removed, the previous checkpoint is intact") from exc
            if not isinstance(exc, OSError):
                record.error = f"{type(exc).__name__}: {exc}"
                raise
            record.error = describe_os_error(exc, self.store.root)
            raise CheckpointError(f"save of step {record.step} into {self.store.root} failed: {record.error}; "
                                  f"no partial checkpoint was published, the previous one is intact") from exc
        record.save_total_s = time.perf_counter() - start
        record.done = True

    def _background(self, pending: Pending, tmp: Path, record: SaveRecord, start: float, needed: int) -> None:
        try:
            self._finish(pending, tmp, record, start, needed)
        except BaseException as exc:  # surfaced by the next call or close()
            self._failure = exc

    def _raise_background_failure(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            kind = type(failure) if isinstance(failure, CheckpointError) else CheckpointError  # DiskFullError stays one
            raise kind(f"a background checkpoint save failed: {failure}") from failure
