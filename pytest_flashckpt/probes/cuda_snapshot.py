"""The CUDA caching allocator's own record of a step, read from ``torch.cuda.memory._snapshot()``: what it reserved
(segments: ``cudaMalloc`` calls), how much of that was handed out, how the free part is cut up, and, from the
recorded history (``_record_memory_history``), the most bytes the step's tensors asked for at once and what the
allocator held at that moment. No torch here: the snapshot is plain dicts and lists, so every function runs (and is
tested) on a machine without a GPU; ``benchmarks/gpu_margin.py`` takes the snapshots on one.

The shapes read are torch's own (``torch.cuda.memory._snapshot``'s docstring, torch 2.13): ``segments`` is a list of
``{"device", "address", "total_size", "allocated_size", "blocks": [{"size", "requested_size", "state", ...}]}`` with
block states ``active_allocated``, ``active_awaiting_free`` and ``inactive``; ``device_traces`` has one list of
``{"action", "addr", "size", ...}`` per device. Two facts of the allocator's C++ the replay relies on: an ``alloc``
entry's ``size`` is the size the caller asked for (before rounding to 512 B blocks), and the allocated-bytes counter
drops at ``free_requested`` (``free_completed`` follows once other streams are done with the block: "active", not
"allocated").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping

ALLOCATED = "active_allocated"
FREE = "inactive"
RESERVE_ACTIONS = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}  # map/unmap: expandable segments


@dataclass(frozen=True)
class SegmentSummary:
    """The allocator's state at one moment (one snapshot, one device).

    ``reserved_bytes`` is what ``memory_reserved`` reports (the segments' sizes), ``allocated_bytes`` what
    ``memory_allocated`` reports (the handed-out blocks, rounded), ``requested_bytes`` what the tensors asked for.
    ``free_bytes`` (reserved, not handed out) is the fragmentation the next large allocation may not be able to
    use: only ``largest_free_block_bytes`` of it is in one piece."""

    segments: int
    reserved_bytes: int
    allocated_bytes: int
    requested_bytes: int
    free_bytes: int
    free_blocks: int
    largest_free_block_bytes: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class TracePeak:
    """The peak of a recorded history: ``peak_requested_bytes`` is the most bytes the tensors asked for at once
    (the figure a live-tensor simulation predicts), ``reserved_at_peak_bytes`` what the segments held at that
    moment; ``max_reserved_bytes`` the most they held at any moment of the history."""

    entries: int
    peak_requested_bytes: int
    reserved_at_peak_bytes: int
    max_reserved_bytes: int
    segment_allocs: int
    segment_frees: int

    @property
    def unused_at_peak_bytes(self) -> int:
        """Reserved but asked for by no tensor at the peak: block rounding plus fragmentation."""
        return self.reserved_at_peak_bytes - self.peak_requested_bytes

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "unused_at_peak_bytes": self.unused_at_peak_bytes}


def device_segments(snapshot: Mapping[str, Any], device: int | None = None) -> list[dict]:
    """The snapshot's segments on ``device`` (all of them when None)."""
    segments = snapshot.get("segments", [])
    return [s for s in segments if device is None or s.get("device", device) == device]


def summarise_segments(snapshot: Mapping[str, Any], device: int | None = None) -> SegmentSummary:
    """Reserved, handed out, asked for, and the free blocks of ``device``'s segments in ``snapshot``."""
    segments = device_segments(snapshot, device)
    blocks = [b for s in segments for b in s.get("blocks", [])]
    allocated = [b for b in blocks if b["state"] == ALLOCATED]
    free = [b["size"] for b in blocks if b["state"] == FREE]
    reserved = sum(s["total_size"] for s in segments)
    handed_out = sum(s["allocated_size"] for s in segments)
    return SegmentSummary(
        segments=len(segments), reserved_bytes=reserved, allocated_bytes=handed_out,
        requested_bytes=sum(b.get("requested_size", b["size"]) for b in allocated),
        free_bytes=reserved - handed_out, free_blocks=len(free), largest_free_block_bytes=max(free, default=0),
    )  # fmt: skip


def device_trace(snapshot: Mapping[str, Any], device: int) -> list[dict]:
    """The recorded history of ``device`` (empty when nothing was recorded)."""
    traces = snapshot.get("device_traces", [])
    return list(traces[device]) if device < len(traces) else []


def replay_trace(entries: Iterable[Mapping[str, Any]], start_requested_bytes: int, start_reserved_bytes: int) -> TracePeak:
    """Walk the history in order from the state it started in (bytes asked for by the tensors alive then, bytes
    reserved then) and return its peak. A free is matched to its ``alloc`` by address, so it takes off what that
    allocation added; a free of a block allocated before the history began takes off the entry's own size."""
    live: dict[int, int] = {}
    requested, reserved = start_requested_bytes, start_reserved_bytes
    peak, reserved_at_peak, max_reserved = requested, reserved, reserved
    count = allocs = frees = 0
    for entry in entries:
        count += 1
        action = entry["action"]
        if action == "alloc":
            live[entry["addr"]] = entry["size"]
            requested += entry["size"]
            if requested > peak:
                peak, reserved_at_peak = requested, reserved
        elif action == "free_requested":
            requested -= live.pop(entry["addr"], entry["size"])
        elif action in RESERVE_ACTIONS:
            sign = RESERVE_ACTIONS[action]
            reserved += sign * entry["size"]
            max_reserved = max(max_reserved, reserved)
            allocs, frees = allocs + (sign > 0), frees + (sign < 0)
    return TracePeak(count, peak, reserved_at_peak, max_reserved, allocs, frees)


def trace_peak(start: Mapping[str, Any], end: Mapping[str, Any], device: int) -> TracePeak:
    """The peak of the history in ``end`` (a snapshot taken after the recorded step), started from ``start`` (one
    taken just before it, with the history cleared): the bytes asked for and reserved at the start come from
    ``start``'s segments."""
    before = summarise_segments(start, device)
    return replay_trace(device_trace(end, device), before.requested_bytes, before.reserved_bytes)
