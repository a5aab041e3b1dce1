"""A reusable staging area for asynchronous saves: a blocking snapshot, or a copy that overlaps the next step.

Buffers are allocated (and touched, so the pages exist; pinned host memory when the source is on a GPU) once, then
every snapshot is a ``copy_`` into them: the training loop never pays an allocation, and later changes to the live
tensors cannot leak into the bytes being written. Only one save may read the area at a time; the checkpointer waits
for the previous write first.

Two ways to fill it:

* :meth:`StagingArea.snapshot` copies everything before returning (the save blocks for the whole copy);
* :meth:`StagingArea.start_copy` returns at once with a :class:`StagedCopy`: on a CPU a thread copies tensor by
  tensor while the caller runs the next forward and backward; on a GPU the copies are queued on a side stream, one
  event per tensor. Parameters and optimizer state only change at the next ``optimizer.step()``, so the caller needs
  a *fence* before it (and before any other in-place change of a saved tensor) that waits for what is not yet copied:
  :meth:`StagedCopy.fence` waits for a prefix of the copy order only (a progress counter on a CPU; on a GPU the
  compute stream waits on the event of the last tensor needed, the host does not block).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable

import torch


SMALL_NUMEL = 1  # scalars (step counters, a tensor LR) are copied in the save call itself: nothing can tear them


class TornSnapshotError(RuntimeError):
    """A tensor changed in place after the save call and before it was staged (a missing fence)."""


class StagingArea:
    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self.allocations = 0  # buffers (re)allocated; stays flat after the first save of a run
        self.on_copy: Callable[[str], None] | None = None  # test hook: called before each tensor of an overlapped copy
        self._worker: ThreadPoolExecutor | None = None
        self._stream = None  # the side CUDA stream, created on the first GPU copy and reused

    def warm(self) -> None:
        """Start the copy thread now: starting a thread waits until it runs, tens of ms on a busy machine, which a
        save call should not pay."""
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="flashckpt-staging")
            self._worker.submit(lambda: None).result()

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._buffers.values())

    def buffers(self) -> list[torch.Tensor]:
        return list(self._buffers.values())

    def snapshot(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Copy ``tensors`` into the staging buffers; returns the staged tensors under the same keys."""
        out = self._reserve(tensors)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # why: see _copy_one
        try:
            for key, src in tensors.items():
                _copy_one(out[key], src)
        finally:
            torch.set_num_threads(threads)
        for device in {t.device for t in tensors.values() if t.is_cuda}:
            torch.cuda.synchronize(device)  # the device the copies were issued on, not the current one
        return out

    def start_copy(self, tensors: dict[str, torch.Tensor]) -> "StagedCopy":
        """Start copying ``tensors`` (in their key order) into the staging buffers; returns at once."""
        staged = self._reserve(tensors)
        if any(t.is_cuda for t in tensors.values()):
            if self._stream is None:
                self._stream = torch.cuda.Stream()
            return CudaStagedCopy(tensors, staged, self._stream)
        self.warm()
        return ThreadStagedCopy(tensors, staged, self.on_copy, self._worker)  # type: ignore[arg-type]

    def _reserve(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The buffer of every key (allocated on first use or when a shape/dtype changed); drops unused buffers."""
        out: dict[str, torch.Tensor] = {}
        for key, src in tensors.items():
            buf = self._buffers.get(key)
            if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
                buf = torch.zeros(src.shape, dtype=src.dtype, device="cpu", pin_memory=src.is_cuda and torch.cuda.is_available())
                self._buffers[key] = buf
                self.allocations += 1
            out[key] = buf
        for key in set(self._buffers) - set(tensors):
            del self._buffers[key]
        return out


def _copy_one(buf: torch.Tensor, src: torch.Tensor) -> None:
    """One tensor, on the calling thread, with one intra-op thread (the caller sets it).

    One thread: a copy is memory-bound, one core already saturates it; with the intra-op pool every one of the ~300
    tensors waits for a pool thread to be scheduled, about 10 ms each on a busy 2-core machine (measured: 0.9 s vs
    0.03 s for the 170 MB ``small`` state)."""
    buf.copy_(src if not src.requires_grad else src.detach(), non_blocking=src.is_cuda)


class StagedCopy:
    """A copy in progress. ``staged`` holds the destination buffers (valid once :meth:`result` returned)."""

    def __init__(self, tensors: dict[str, torch.Tensor], staged: dict[str, torch.Tensor]) -> None:
        self.keys = list(tensors)
        self.order = {k: i for i, k in enumerate(self.keys)}
        self.staged = staged
        self.fence_wait_s = 0.0  # time callers spent blocked in fence()

    def fence(self, keys: Iterable[str] | None = None) -> float:
        """Order every later in-place change of the tensors ``keys`` (all when None) after their copy; returns the
        seconds the host blocked."""
        raise NotImplementedError

    def result(self) -> dict[str, torch.Tensor]:
        """Block until every tensor is in its staging buffer (raises the copy's failure); returns ``staged``."""
        raise NotImplementedError

    def _prefix(self, keys: Iterable[str] | None) -> int:
        if keys is None:
            return len(self.keys)
        return max((self.order[k] + 1 for k in keys if k in self.order), default=0)


class ThreadStagedCopy(StagedCopy):
    """CPU: tensors of at most ``SMALL_NUMEL`` elements are copied in the save call; the staging area's copy thread
    copies the rest tensor by tensor and advances a progress counter; ``fence`` waits for a prefix.

    Each source's version counter (bumped by every in-place op) is recorded at the save call and checked around its
    copy: an unfenced in-place change that lands before the tensor is staged fails the save instead of writing a
    torn snapshot (a safety net for a missing fence, not a replacement for one: a change racing the copy of that very
    tensor can slip through)."""

    def __init__(self, tensors: dict[str, torch.Tensor], staged: dict[str, torch.Tensor], on_copy: Callable[[str], None] | None,
                 worker: ThreadPoolExecutor) -> None:
        small = [k for k, t in tensors.items() if t.numel() <= SMALL_NUMEL]
        tensors = {**{k: tensors[k] for k in small}, **{k: t for k, t in tensors.items() if t.numel() > SMALL_NUMEL}}
        super().__init__(tensors, staged)
        for key in small:  # microseconds each
            _copy_one(staged[key], tensors[key].detach())
        self._sources = [tensors[k] for k in self.keys]  # detached by the worker (a detached view shares the version counter)
        self._versions = [t._version for t in self._sources]
        self._on_copy = on_copy
        self._copied = len(small)
        self._failure: BaseException | None = None
        self._cond = threading.Condition()
        self.copy_s: float | None = None
        self._future = worker.submit(self._run)

    def _run(self) -> None:
        torch.set_num_threads(1)  # this thread's intra-op width only (see _copy_one); training keeps its own
        start = time.perf_counter()
        try:
            for i, key in enumerate(self.keys):
                if i < self._copied:
                    continue
                if self._on_copy is not None:
                    self._on_copy(key)
                src = self._sources[i].detach()
                if src._version != self._versions[i]:
                    raise TornSnapshotError(f"tensor {key!r} was changed in place after the save call and before it was staged; "
                                            f"call Checkpointer.fence() before changing saved tensors in place")
                _copy_one(self.staged[key], src)
                with self._cond:
                    self._copied = i + 1
                    self._cond.notify_all()
        except BaseException as exc:
            with self._cond:
                self._failure = exc
                self._cond.notify_all()
        finally:
            self._sources = []
            self.copy_s = time.perf_counter() - start

    @property
    def copied(self) -> int:
        return self._copied

    def fence(self, keys: Iterable[str] | None = None) -> float:
        needed = self._prefix(keys)
        if self._copied >= needed or self._failure is not None:
            return 0.0
        start = time.perf_counter()
        with self._cond:
            self._cond.wait_for(lambda: self._copied >= needed or self._failure is not None)
        waited = time.perf_counter() - start
        self.fence_wait_s += waited
        return waited

    def result(self) -> dict[str, torch.Tensor]:
        self._future.result()
        if self._failure is not None:
            raise self._failure
        return self.staged


class CudaStagedCopy(StagedCopy):
    """GPU: copies queued on a side stream into pinned buffers, one event per tensor.

    The side stream first waits for the compute stream (the state as of the save call); ``fence`` makes the current
    stream wait for the event of the last tensor it needs (no host block); ``result`` synchronises the host on the
    last event before the writer reads the buffers."""

    def __init__(self, tensors: dict[str, torch.Tensor], staged: dict[str, torch.Tensor], stream=None) -> None:
        super().__init__(tensors, staged)
        compute = torch.cuda.current_stream()
        self.stream = stream if stream is not None else torch.cuda.Stream()
        self.stream.wait_stream(compute)
        self.events = []
        self._sources = [tensors[k] for k in self.keys]  # alive until the copy is done (the allocator must not reuse them)
        with torch.cuda.stream(self.stream):
            for key, src in zip(self.keys, self._sources):
                self.staged[key].copy_(src.detach(), non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.stream)
                self.events.append(event)

    def fence(self, keys: Iterable[str] | None = None) -> float:
        needed = self._prefix(keys)
        if needed:
            torch.cuda.current_stream().wait_event(self.events[needed - 1])
        return 0.0

    def result(self) -> dict[str, torch.Tensor]:
        if self.events:
            self.events[-1].synchronize()
        self._sources = []
        return self.staged
