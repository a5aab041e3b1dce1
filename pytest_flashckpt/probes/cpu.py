"""Exact live-tensor accounting on the CPU with a ``TorchDispatchMode``.

Every tensor an aten op returns is attributed to its *storage*: views and in-place ops share the storage, so they
are never counted twice. A storage is counted from the first op that produces (or uses) it until the storage
is freed, which a weak reference on the storage object reports (PyTorch keeps one Python object per storage
for as long as the storage lives). Storages alive when tracking starts (parameters, optimizer state, the
batch) are passed as ``resident`` and counted from the start. The result is deterministic to the byte for a
deterministic program: no sampling, no allocator rounding, no threads.

What it cannot see: scratch memory a kernel allocates and frees inside one op (for example the CPU flash kernel's
per-thread buffers), and 0-dim tensors made from Python scalars outside the dispatcher (autograd's and the
optimizer's wrapped numbers, e.g. the backward of ``0.5 * x``), which never pass through a ``TorchDispatchMode``.
``torch.profiler`` memory events see both. How much that moves a step's peak is measured by
``benchmarks/probe_gap.py`` (``reports/probe-gap.md``; README "What a run does"): a few dozen bytes in tens of MB
on our GPT and on a Hugging Face GPT-2 step. Counting them would need the profiler's allocator events on every
memory pass; the gap is small enough to state instead.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Iterable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pytest_flashckpt.probes.base import MemoryReading


class _LiveStorages(TorchDispatchMode):
    """Tracks bytes of live storages on one device type."""

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()
        self.device_type = device_type
        self.live_bytes = 0
        self.peak_bytes = 0
        self._sizes: dict[int, int] = {}  # id(storage object) -> bytes counted
        self._refs: dict[int, weakref.ref] = {}
        self._op = None  # the op being dispatched (an OpOverload; named only when asked, see peak_op_name)
        self.peak_op = None  # the op whose output (or input seen first) reached the current peak

    def add(self, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != self.device_type:
            return
        storage = tensor.untyped_storage()
        key = id(storage)
        nbytes = storage.nbytes()
        known = self._sizes.get(key)
        if known is None:
            self._refs[key] = weakref.ref(storage, lambda _ref, key=key: self._free(key))
            self._sizes[key] = nbytes
            self.live_bytes += nbytes
        elif known != nbytes:  # a storage resized in place (out= ops)
            self._sizes[key] = nbytes
            self.live_bytes += nbytes - known
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
            self.peak_op = self._op
            self._on_new_peak()

    def _on_new_peak(self) -> None:
        """Called when ``peak_bytes`` grows; subclasses snapshot what is alive (see ``simulate.probe``)."""

    @property
    def peak_op_name(self) -> str:
        return "" if self.peak_op is None else str(self.peak_op)

    def _free(self, key: int) -> None:
        self.live_bytes -= self._sizes.pop(key, 0)
        self._refs.pop(key, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self._op = func
        inputs, _ = tree_flatten((args, kwargs))
        for t in inputs:  # tensors made outside the mode (e.g. by a DataLoader) count from first use
            if isinstance(t, torch.Tensor):
                self.add(t)
        out = func(*args, **kwargs)
        outputs, _ = tree_flatten(out)
        for t in outputs:
            if isinstance(t, torch.Tensor):
                self.add(t)
        return out


class LiveTensorProbe:
    """The ``cpu`` probe: exact bytes of live tensor storages."""

    name = "cpu"
    mode_class: type[_LiveStorages] = _LiveStorages  # the dispatch mode that counts (a subclass may re-check sizes)

    def __init__(self, device_type: str = "cpu") -> None:
        self.device_type = device_type

    @contextlib.contextmanager
    def track(self, resident: Iterable[torch.Tensor] = ()) -> Iterator[MemoryReading]:
        mode = self.mode_class(self.device_type)
        for tensor in resident:
            mode.add(tensor)
        reading = MemoryReading(self.name, start_bytes=mode.live_bytes, exact=True)
        try:
            with mode:
                yield reading
        finally:
            reading.peak_bytes = mode.peak_bytes
            reading.end_bytes = mode.live_bytes


class LiveBytes:
    """A running count of live tensor bytes for a gauge (memory-aware save scheduling): the ``cpu`` probe's exact
    accounting, active only inside ``with live.counting():`` blocks (training steps), so the saves in between are
    not slowed by a dispatch mode; storages freed outside a block are still subtracted (weak references)."""

    def __init__(self, resident: Iterable[torch.Tensor] = (), device_type: str = "cpu") -> None:
        self._mode = _LiveStorages(device_type)
        for tensor in resident:
            self._mode.add(tensor)

    @property
    def live_bytes(self) -> int:
        return self._mode.live_bytes

    @property
    def peak_bytes(self) -> int:
        return self._mode.peak_bytes

    def counting(self) -> _LiveStorages:
        return self._mode

