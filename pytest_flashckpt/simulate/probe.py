"""The cpu probe's live-storage accounting, on any device type, with the peak broken down by category.

Every storage gets a serial number when the probe first sees it and a category from the phase it was born in:

- ``parameters`` / ``optimizer_state``: resident when the step starts (tagged by the caller);
- ``activations``: born in the forward pass (what autograd keeps for backward, the token batch, and, if the
  peak falls inside the forward, the forward's own working tensors);
- ``gradients``: re-tagged when autograd accumulates it into a parameter's ``.grad``;
- ``temporaries``: born in the backward pass or optimizer step and not a gradient (activation gradients,
  activations recomputed by checkpointing, optimizer scratch).

With ``shard_ratio`` < 1 (FSDP, see ``simulate.fsdp``) the probe also keeps a rank's view: parameters,
optimizer state, gradients once accumulated (FSDP2 reduce-scatters a block's gradient into its shard) and
storages born in the optimizer step (which runs on the local shards) count ``shard_ratio`` of their bytes;
activations and unsharded gradients in flight count in full. Its peak (``rank_peak``) is found the same way.

Checkpointing's CPU RNG states (``probes.cpu``) are counted when the caller sets ``count_rng_states`` (a CPU
target; on a GPU they are host memory), categorised like any storage born in that phase.

The snapshot at the peak keeps serials (not storage ids, which Python may reuse after a free), so a tensor that
became a gradient after the peak is still attributed correctly. The bytes counted are exactly the base probe's.
"""

from __future__ import annotations

import torch

from pytest_flashckpt.probes.cpu import _LiveStorages

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries")
SHARDED = ("parameters", "gradients", "optimizer_state")  # what FSDP keeps as 1/N shards


class AttributedStorages(_LiveStorages):
    def __init__(self, device_type: str = "meta", shard_ratio: float = 1.0) -> None:
        super().__init__(device_type)
        self.shard_ratio = shard_ratio
        self._weight: dict[int, float] = {}  # serial -> share of its bytes a rank holds
        self.rank_live = 0.0
        self.rank_peak = 0.0
        self.rank_peak_snapshot: dict[int, int] = {}
        self.rank_peak_op = None
        self.rank_peak_phase = ""
        self.phase = "forward"  # forward | backward | optimizer: storages born in the forward are activations
        self.peak_phase = ""
        self.block: int | None = None  # block whose forward is running (for per-block kept bytes)
        self._serial: dict[int, int] = {}  # id(storage) -> serial, while alive
        self._category: dict[int, str] = {}  # serial -> category
        self._block_of: dict[int, int] = {}  # serial -> block born in
        self._next = 0
        self.peak_snapshot: dict[int, int] = {}  # serial -> bytes, at the peak
        self.kept_snapshot: dict[int, int] = {}  # serial -> bytes, when the forward pass ended (set by the caller)
        self.start_bytes = 0  # live when the step started (set by the caller once the resident state is added)
        self.rank_start = 0.0

    def add(self, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != self.device_type:
            return
        self._count(tensor)

    def _count(self, tensor: torch.Tensor) -> None:
        key = id(tensor.untyped_storage())
        if key not in self._serial:
            serial = self._next
            self._next += 1
            self._serial[key] = serial
            self._category[serial] = "activations" if self.phase == "forward" else "temporaries"
            self._weight[serial] = self.shard_ratio if self.phase == "optimizer" else 1.0
            if self.block is not None:
                self._block_of[serial] = self.block
        before = self.live_bytes
        super()._count(tensor)
        self._rank_add((self.live_bytes - before) * self._weight[self._serial[key]])

    def _rank_add(self, delta: float) -> None:
        self.rank_live += delta
        if self.rank_live > self.rank_peak:
            self.rank_peak = self.rank_live
            if self.shard_ratio != 1.0:  # (unsharded: the rank's view is the plain one, snapshotted by _on_new_peak)
                self.rank_peak_snapshot = {
                    self._serial[key]: nbytes * self._weight[self._serial[key]] for key, nbytes in self._sizes.items()
                }
                self.rank_peak_op = self._op
                self.rank_peak_phase = self.phase

    def add_resident(self, tensor: torch.Tensor, category: str) -> None:
        self.add(tensor)
        self.tag(tensor, category)


    def tag(self, tensor: torch.Tensor, category: str) -> None:
        """Re-categorise the storage of a tensor the probe has seen (a parameter's accumulated gradient)."""
        if tensor.device.type != self.device_type:
            return
        key = id(tensor.untyped_storage())
        serial = self._serial.get(key)
        if serial is not None:
            self._category[serial] = category
            weight = self.shard_ratio if category in SHARDED else 1.0
            old = self._weight[serial]
            if old != weight:
                self._weight[serial] = weight
                self._rank_add(self._sizes.get(key, 0) * (weight - old))

    def _free(self, key: int) -> None:
        serial = self._serial.pop(key, None)
        if serial is not None:
            self.rank_live -= self._sizes.get(key, 0) * self._weight[serial]
        super()._free(key)

    def _on_new_peak(self) -> None:
        self.peak_snapshot = self.snapshot()
        self.peak_phase = self.phase

    def snapshot(self) -> dict[int, int]:
        """Serial -> bytes of every storage alive now."""
        return {self._serial[key]: nbytes for key, nbytes in self._sizes.items()}

    def breakdown(self, snapshot: dict[int, float]) -> dict[str, int]:
        """Bytes per category in ``snapshot`` (``peak_snapshot`` or the rank's ``rank_peak_snapshot``)."""
        out: dict[str, float] = dict.fromkeys(CATEGORIES, 0)
        for serial, nbytes in snapshot.items():
            out[self._category[serial]] += nbytes
        return {category: round(nbytes) for category, nbytes in out.items()}

    def by_block(self, snapshot: dict[int, int], n_blocks: int) -> tuple[tuple[int, ...], int]:
        """Bytes of ``snapshot``'s activations born in each block's forward, and those born outside any block."""
        blocks = [0] * n_blocks
        outside = 0
        for serial, nbytes in snapshot.items():
            if self._category[serial] != "activations":
                continue
            block = self._block_of.get(serial)
            if block is None:
                outside += nbytes
            else:
                blocks[block] += nbytes
        return tuple(blocks), outside
