"""The rank probe (``distributed.memory.ShardedLiveTensorProbe``) with its in-place resizes seen as they happen,
for the simulated rank.

The rank probe re-reads the size of every live storage before every op, because FSDP2 frees and re-grows its
all-gather buffers with ``untyped_storage().resize_`` (``_fsdp_param.free_storage`` / ``alloc_storage``), which is
not an aten op. On a deep card that is most of the probed step's time (profiled on Llama-3-70B at 8 blocks under
``python -m cProfile``: ``_rescan`` 5.1 s of the step's 15.8 s, and it grows with blocks x ops, so quadratically in
the depth). Here ``torch.UntypedStorage.resize_`` is wrapped while the probe tracks: a resized storage is marked,
and before the next op only the marked storages are re-read, with the same update as the full re-read at the same
moment, so every reading equals the rank probe's to the byte (``tests/simulate/test_layer_extrapolation.py``).
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch._subclasses.fake_tensor import is_fake

from pytest_flashckpt.distributed.memory import ShardedLiveTensorProbe, _RankStorages
from pytest_flashckpt.distributed.memory import _CompiledRankStorages as _CompiledSharded


@contextlib.contextmanager
def _reporting_resizes(report):
    """While active, every ``UntypedStorage.resize_`` hands the storage's id to ``report`` after resizing it."""
    original = torch.UntypedStorage.resize_

    @functools.wraps(original)
    def resize_(storage, size):
        out = original(storage, size)
        report(id(storage))
        return out

    torch.UntypedStorage.resize_ = resize_
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = original


class _ResizeTrackingStorages(_RankStorages):
    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__(device_type)
        self._resized: set[int] = set()
        self._resize_patch: contextlib.ExitStack | None = None

    def __enter__(self):
        self._resize_patch = contextlib.ExitStack()
        self._resize_patch.enter_context(_reporting_resizes(self._resized.add))
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._resize_patch.close()
            self._resize_patch = None

    def _rescan(self) -> None:
        """``_RankStorages._rescan`` restricted to the storages resized since the last op (the others kept their
        size: nothing else changes a storage's size outside the dispatcher)."""
        if not self._resized:
            return
        resized = list(self._resized)
        self._resized.clear()  # (in place: the resize_ wrapper adds to this set)
        for key in resized:
            ref = self._refs.get(key)
            storage = None if ref is None else ref()
            if storage is None:
                continue
            nbytes = storage.nbytes()
            known = self._sizes.get(key)
            if known is not None and nbytes != known:
                self._sizes[key] = nbytes
                self.live_bytes += nbytes - known


class ResizeTrackingRankProbe(ShardedLiveTensorProbe):
    """``ShardedLiveTensorProbe``, re-reading only the storages resized in place since the last op."""

    mode_class = _ResizeTrackingStorages


class _CompiledRankStorages(_ResizeTrackingStorages, _CompiledSharded):
    """``_ResizeTrackingStorages`` under compiled code (``distributed.memory._CompiledRankStorages``: Dynamo runs
    compiled regions under it). A compiled region calls ``_c10d_functional.wait_tensor`` on a collective's result
    and drops what it returns; on a real rank the op returns its input, under fake mode a new buffer of its size
    (the op's fake kernel). The fake rank is handed the input back, as a real rank is, so nothing is counted. A
    real tensor's wait runs (a gloo rank measured with this probe, ``benchmarks/spike_compiled_fake_ranks.py``:
    skipped, the rank read a collective's result before it was complete and crashed)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops._c10d_functional.wait_tensor.default and is_fake(args[0]):
            return args[0]  # (a fake process group's collective is complete when issued: nothing to wait for)
        return super().__torch_dispatch__(func, types, args, kwargs)


class CompiledRankProbe(ResizeTrackingRankProbe):
    """``ResizeTrackingRankProbe`` that a compiled rank runs under (its regions compiled, not run eager): the bytes
    of ``distributed.memory.CompiledShardedProbe``, read on a fake rank (``simulate.fake_ranks``) and a gloo rank
    alike (``reports/spike-compiled-fake-ranks.md``)."""

    mode_class = _CompiledRankStorages
