"""The ``cpu`` memory probe made aware of storages resized in place, which FSDP2 does on every step.

FSDP2 frees a block's all-gathered (unsharded) parameters with ``untyped_storage().resize_(0)`` and re-grows the
same storage for the next all-gather. A storage resize is not an aten op, so the plain ``cpu`` probe never sees the
shrink and keeps counting every gathered block as live: under FSDP2 it reported the same peak with and without
activation checkpointing. Here the sizes of the tracked storages are re-read before every op, so a freed gather
buffer stops counting before the next allocation. Costs one ``nbytes()`` per live storage per op (fine for one
measured step).
"""

from __future__ import annotations

from pytest_flashckpt.probes.cpu import LiveTensorProbe, _LiveStorages


class _ResizeAwareStorages(_LiveStorages):
    def _rescan(self) -> None:
        for key, ref in list(self._refs.items()):
            storage = ref()
            if storage is None:
                continue
            nbytes = storage.nbytes()
            known = self._sizes.get(key)
            if known is not None and nbytes != known:
                self._sizes[key] = nbytes
                self.live_bytes += nbytes - known

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._rescan()
        return super().__torch_dispatch__(func, types, args, kwargs)


class ShardedLiveTensorProbe(LiveTensorProbe):
    """Exact live tensor bytes on one rank, FSDP2's in-place storage frees included."""

    mode_class = _ResizeAwareStorages
