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

One tensor made outside the dispatcher is large and predictable, so it is counted: ``torch.utils.checkpoint`` keeps
``torch.get_rng_state()`` (the CPU generator's state, 5,056 B on torch 2.x) for every checkpointed block from its
forward until its recomputation, and takes one more while it recomputes (``fork_rng``). With ``count_rng_states``
(on for the ``cpu`` device) the probe wraps ``torch.get_rng_state`` while it tracks and counts every state it
returns like any storage, freed when its last reference goes (``tests/probes/test_rng_states.py`` checks it
against the profiler's allocator events). The CUDA generator's states are host tensors too, never device memory.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Iterable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_is_leaf

from pytest_flashckpt.probes.base import MemoryReading


def _tensors(tree, found: list) -> list:
    """The tensors among ``tree_flatten(tree)``'s leaves, in its order, appended to ``found``: plain lists, tuples
    and dicts (all an op's arguments and results are made of) walked here, any other pytree node handed to
    ``tree_flatten``. Called for every op a probe sees, where building pytree's specs cost more than the op."""
    kind = type(tree)
    if kind is list or kind is tuple:
        for item in tree:
            _tensors(item, found)
    elif kind is dict:
        for item in tree.values():
            _tensors(item, found)
    elif isinstance(tree, torch.Tensor):
        found.append(tree)
    elif not tree_is_leaf(tree):  # a namedtuple, an OrderedDict, a registered class: pytree's own order
        found.extend(t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor))
    return found


@contextlib.contextmanager
def _counting_rng_states(count) -> Iterator[None]:
    """``torch.get_rng_state`` handing every state it returns to ``count`` (checkpointing looks it up on ``torch`` at
    each call, so replacing the attribute reaches it)."""
    original = torch.get_rng_state

    def get_rng_state() -> torch.Tensor:
        state = original()
        count(state)
        return state

    torch.get_rng_state = get_rng_state
    try:
        yield
    finally:
        torch.get_rng_state = original


class _LiveStorages(TorchDispatchMode):
    """Tracks bytes of live storages on one device type (and, with ``count_rng_states``, the CPU RNG states
    ``torch.get_rng_state`` makes while the mode is active, whatever the device type)."""

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()
        self.device_type = device_type
        self.count_rng_states = device_type == "cpu"
        self.rng_state_bytes = 0  # bytes of every RNG state taken while active (alive or not)
        self._rng_patch: contextlib.ExitStack | None = None
        self.adopted: list[weakref.ref] = []  # tensors first seen as an op's input: alive before tracking began
        self.live_bytes = 0
        self.peak_bytes = 0
        self._sizes: dict[int, int] = {}  # id(storage object) -> bytes counted
        self._refs: dict[int, weakref.ref] = {}
        self._op = None  # the op being dispatched (an OpOverload; named only when asked, see peak_op_name)
        self.peak_op = None  # the op whose output (or input seen first) reached the current peak

    def add(self, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != self.device_type:
            return
        self._count(tensor)

    def add_rng_state(self, state: torch.Tensor) -> None:
        """An RNG state made outside the dispatcher (a CPU tensor, counted whatever the mode's device type)."""
        self.rng_state_bytes += state.untyped_storage().nbytes()
        self._count(state)

    def __enter__(self):
        if self.count_rng_states:
            self._rng_patch = contextlib.ExitStack()
            self._rng_patch.enter_context(_counting_rng_states(self.add_rng_state))
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            if self._rng_patch is not None:
                self._rng_patch.close()
                self._rng_patch = None

    def _count(self, tensor: torch.Tensor) -> None:
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
        # tensors made outside the mode (e.g. by a DataLoader) count from first use
        for t in _tensors((args, kwargs), []):
            if t.device.type == self.device_type and id(t.untyped_storage()) not in self._sizes:
                self.adopted.append(weakref.ref(t))
            self.add(t)
        out = func(*args, **kwargs)
        for t in _tensors(out, []):
            self.add(t)
        return out


class LiveTensorProbe:
    """The ``cpu`` probe: exact bytes of live tensor storages."""

    name = "cpu"
    mode_class: type[_LiveStorages] = _LiveStorages  # the dispatch mode that counts (a subclass may re-check sizes)

    def __init__(self, device_type: str = "cpu") -> None:
        self.device_type = device_type
        self._adopted: list[weakref.ref] = []

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
            self._read(mode, reading)

    def adopted(self) -> list[torch.Tensor]:
        """Tensors the last tracked region used that were neither resident nor made inside it and are still alive:
        state that existed before the region (an optimizer's moments not passed as resident, a batch made
        earlier), which the region counted only from first use. Tracking again with them resident counts them from
        the start (``fixture.measure`` does, so a step cannot read short of its true peak)."""
        tensors = [ref() for ref in self._adopted]
        return [t for t in tensors if t is not None]

    def _read(self, mode: _LiveStorages, reading: MemoryReading) -> None:
        """Fill ``reading`` from the mode when tracking ends (a subclass may add ``extra`` entries)."""
        self._adopted = mode.adopted
        reading.peak_bytes = mode.peak_bytes
        reading.end_bytes = mode.live_bytes
        if mode.rng_state_bytes:
            reading.extra["rng_state_bytes"] = mode.rng_state_bytes


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

