"""The ``cpu`` memory probe made to count what one FSDP2 rank holds.

Three things differ from a single process, and each would make the plain ``cpu`` probe wrong on a rank:

- **Sharded parameters are DTensors.** ``DTensor.untyped_storage()`` is the wrapper's storage, which holds nothing
  but reports the *global* (unsharded) size. A ``TorchDispatchMode`` sees the DTensors (modes run before the
  DTensor subclass unwraps them), so the probe counted every AdamW temporary at the unsharded size and put every
  rank's peak in the optimizer step. Here a DTensor counts as its local shard (``_local_tensor``): what the rank
  holds. The same holds for the ``AsyncCollectiveTensor`` an eager functional collective returns (a wrapper
  subclass whose storage reports the result's size): it counts as the result it wraps (``elem``). Without that a
  context-parallel rank counted each all-gathered K/V of torch's ring attention twice while the wrapper lived
  (reports/spike-cp-ranks.md).
- **Gathered parameters are freed in place.** FSDP2 frees a block's all-gathered (unsharded) parameters with
  ``untyped_storage().resize_(0)`` and re-grows the same storage for the next all-gather. A storage resize is not an
  aten op, so the sizes of the tracked storages are re-read before every op (one ``nbytes()`` per live storage per
  op; fine for one measured step) and a freed gather buffer stops counting before the next allocation.
- **gloo stages every all-gather** in buffers of the gathered size it allocates inside the collective (one on the
  calling thread, one on gloo's worker thread), out of the dispatcher's sight. How long they live depends on when
  gloo's thread runs, so the CPU allocator's peak moves by parts of them from one run to the next (measured on a
  3-block card at world 2 and 4: 0 to 1.2 x the largest all-gather on a quiet machine, 2.4 x under a load of 16):
  they are not counted. The probe records the largest all-gather output it saw (``largest_allgather_bytes``),
  which bounds them: with two all-gathers in flight (the running block's and the prefetched one's) of two copies
  each, on a CPU rank allocator - probe is between 0 and ``GLOO_STAGING_FACTOR`` (4) x that, plus a few 0-dim
  scalars. NCCL gathers in place, so on a GPU there is nothing to add.

Reduce-scatter inputs and outputs are ordinary tensors FSDP2 allocates through the dispatcher: counted as usual.
Checked against the CPU allocator's events (``probes.allocator``) on cards of odd sizes at world 2 and 4 by
``tests/distributed/test_rank_memory.py``.
"""

from __future__ import annotations


import torch
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_flatten

from pytest_flashckpt.probes.cpu import LiveTensorProbe, _LiveStorages

GLOO_ALLGATHER_COPIES = 2  # buffers of an all-gather's output size gloo holds while it is in flight (measured)
GLOO_ALLGATHERS_IN_FLIGHT = 2  # FSDP2 issues the next block's all-gather before the current one is consumed
GLOO_STAGING_FACTOR = GLOO_ALLGATHER_COPIES * GLOO_ALLGATHERS_IN_FLIGHT


def _allgather_ops() -> tuple:
    c10d = torch.ops.c10d
    return tuple(getattr(c10d, name).default for name in ("_allgather_base_", "allgather_into_tensor_coalesced_") if hasattr(c10d, name))


class _RankStorages(_LiveStorages):
    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__(device_type)
        self.largest_allgather_bytes = 0
        self._allgathers = _allgather_ops()

    def add(self, tensor: torch.Tensor) -> None:
        while isinstance(tensor, (DTensor, AsyncCollectiveTensor)):  # wrappers: count what they hold
            tensor = tensor._local_tensor if isinstance(tensor, DTensor) else tensor.elem
        super().add(tensor)

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
        if func in self._allgathers:
            outputs = [t for t in tree_flatten(args[0])[0] if isinstance(t, torch.Tensor)]
            self.largest_allgather_bytes = max(self.largest_allgather_bytes, *(t.untyped_storage().nbytes() for t in outputs))
        return super().__torch_dispatch__(func, types, args, kwargs)


class ShardedLiveTensorProbe(LiveTensorProbe):
    """Exact live tensor bytes on one rank: local shards and gathered parameters while they live. Its reading's
    ``extra["largest_allgather_bytes"]`` is the largest all-gather output of the region (gloo's staging bound)."""

    name = "cpu"
    mode_class = _RankStorages

    def _read(self, mode: _RankStorages, reading) -> None:
        super()._read(mode, reading)
        reading.extra["largest_allgather_bytes"] = mode.largest_allgather_bytes


class _CompiledRankStorages(_RankStorages):
    """The rank probe's storages under compiled code: Dynamo skips every frame while a dispatch mode is active
    unless the mode says ``ignore_compile_internals`` (off while compiling, on while the compiled wrapper runs, so
    it counts the wrapper's buffers as ``simulate.compiled``'s probe does in one process)."""

    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


class CompiledShardedProbe(ShardedLiveTensorProbe):
    """``ShardedLiveTensorProbe`` that a compiled rank runs under, its regions compiled (not run eager): what a
    compiled tensor-parallel rank holds, window by window, beside the allocator's view of the same step
    (``distributed.rank``) and the simulated rank (``simulate.rank_probe.CompiledRankProbe``, the same bytes)."""

    mode_class = _CompiledRankStorages
