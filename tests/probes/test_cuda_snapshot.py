"""``probes.cuda_snapshot`` reads torch's ``_snapshot()`` dicts: here on synthetic snapshots shaped as torch 2.13's
docstring describes them (segments of blocks; one list of trace entries per device), and on CUDA against the
allocator's own counters, which checks the two allocator facts the replay relies on (an ``alloc`` entry carries the
requested size; the allocated counter drops at ``free_requested``)."""

from __future__ import annotations

import pytest
import torch

from pytest_flashckpt.probes.cuda_snapshot import (
    SegmentSummary,
    replay_trace,
    summarise_segments,
    trace_peak,
)

MIB = 2**20


def block(size: int, state: str, requested: int | None = None) -> dict:
    return {"size": size, "requested_size": size if requested is None else requested, "address": 0, "state": state,
            "frames": []}


def segment(blocks: list[dict], device: int = 0, segment_type: str = "large") -> dict:
    total = sum(b["size"] for b in blocks)
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    return {"device": device, "address": 0, "total_size": total, "stream": 0, "segment_type": segment_type,
            "segment_pool_id": (0, 0), "allocated_size": allocated, "active_size": allocated, "blocks": blocks}


def entry(action: str, addr: int, size: int) -> dict:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": []}


def test_summary_counts_reserved_handed_out_requested_and_the_free_pieces():
    snapshot = {
        "segments": [
            segment([block(6 * MIB, "active_allocated", 6 * MIB - 100), block(14 * MIB, "inactive")]),
            segment([block(512, "active_allocated", 8), block(2 * MIB - 512, "inactive")], segment_type="small"),
        ],
        "device_traces": [[]],
    }
    assert summarise_segments(snapshot, 0) == SegmentSummary(
        segments=2, reserved_bytes=22 * MIB, allocated_bytes=6 * MIB + 512, requested_bytes=6 * MIB - 100 + 8,
        free_bytes=16 * MIB - 512, free_blocks=2, largest_free_block_bytes=14 * MIB,
    )  # fmt: skip


def test_summary_reads_one_device_only():
    snapshot = {"segments": [segment([block(2 * MIB, "inactive")], device=0),
                             segment([block(20 * MIB, "active_allocated")], device=1)]}
    assert summarise_segments(snapshot, 0).reserved_bytes == 2 * MIB
    assert summarise_segments(snapshot, 1).allocated_bytes == 20 * MIB
    assert summarise_segments(snapshot).segments == 2


def test_summary_of_an_empty_allocator_is_zero():
    assert summarise_segments({"segments": []}, 0) == SegmentSummary(0, 0, 0, 0, 0, 0, 0)


def test_replay_finds_the_peak_and_what_was_reserved_then():
    trace = [
        entry("segment_alloc", 0x1000, 20 * MIB),
        entry("alloc", 0x1000, 8 * MIB),
        entry("alloc", 0x2000, 10 * MIB),  # a peak: 100 + 18 MiB asked for, 150 + 20 MiB reserved
        entry("free_requested", 0x1000, 8 * MIB),
        entry("free_completed", 0x1000, 8 * MIB),  # already off the allocated count: not taken off twice
        entry("segment_alloc", 0x9000, 40 * MIB),
        entry("alloc", 0x9000, 12 * MIB),  # 100 + 10 + 12: a higher peak, under 150 + 20 + 40 MiB reserved
        entry("free_requested", 0x9000, 12 * MIB),
        entry("segment_free", 0x9000, 40 * MIB),
    ]
    peak = replay_trace(trace, start_requested_bytes=100 * MIB, start_reserved_bytes=150 * MIB)
    assert peak.peak_requested_bytes == 122 * MIB
    assert peak.reserved_at_peak_bytes == 210 * MIB
    assert peak.max_reserved_bytes == 210 * MIB
    assert peak.unused_at_peak_bytes == 88 * MIB
    assert (peak.entries, peak.segment_allocs, peak.segment_frees) == (9, 2, 1)


def test_a_free_takes_off_what_its_alloc_added_not_the_free_entrys_size():
    trace = [entry("alloc", 0x1000, 1000), entry("free_requested", 0x1000, 1024), entry("alloc", 0x1000, 1000)]
    assert replay_trace(trace, 0, 0).peak_requested_bytes == 1000


def test_a_free_of_a_block_from_before_the_history_takes_off_its_own_size():
    trace = [entry("free_requested", 0x7000, 300), entry("alloc", 0x8000, 200)]
    peak = replay_trace(trace, start_requested_bytes=1000, start_reserved_bytes=4000)
    assert peak.peak_requested_bytes == 1000  # the start; 1000 - 300 + 200 never exceeds it
    assert peak.reserved_at_peak_bytes == 4000


def test_expandable_segments_map_and_unmap_count_as_reserved():
    trace = [entry("segment_map", 0, 64 * MIB), entry("alloc", 0, 60 * MIB), entry("free_requested", 0, 60 * MIB),
             entry("segment_unmap", 0, 64 * MIB)]
    peak = replay_trace(trace, 0, 0)
    assert (peak.reserved_at_peak_bytes, peak.max_reserved_bytes, peak.segment_frees) == (64 * MIB, 64 * MIB, 1)


def test_trace_peak_starts_from_the_snapshot_before_the_step():
    start = {"segments": [segment([block(4 * MIB, "active_allocated", 3 * MIB), block(16 * MIB, "inactive")])],
             "device_traces": [[]]}
    end = {"segments": start["segments"], "device_traces": [[entry("alloc", 0x5000, 5 * MIB)], [entry("alloc", 1, 99 * MIB)]]}
    peak = trace_peak(start, end, device=0)
    assert peak.peak_requested_bytes == 8 * MIB  # 3 MiB asked for before, 5 during; device 1's entry is not ours
    assert peak.reserved_at_peak_bytes == 20 * MIB


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; this machine has none")
def test_the_snapshot_agrees_with_the_allocators_counters_on_a_gpu():
    memory = torch.cuda.memory
    device = torch.cuda.current_device()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    kept = torch.empty(1000, dtype=torch.uint8, device="cuda")  # rounded to 512-byte blocks by the allocator
    memory._record_memory_history(enabled="all", context=None, stacks="python", clear_history=True)
    try:
        start = memory._snapshot()
        torch.cuda.reset_peak_memory_stats()
        a = torch.empty(3 * MIB + 1, dtype=torch.uint8, device="cuda")
        b = torch.empty(5 * MIB + 3, dtype=torch.uint8, device="cuda")
        del a
        c = torch.empty(7, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        end = memory._snapshot()
    finally:
        memory._record_memory_history(enabled=None)
    after = summarise_segments(end, device)
    assert after.reserved_bytes == torch.cuda.memory_reserved()
    assert after.allocated_bytes == torch.cuda.memory_allocated()
    peak = trace_peak(start, end, device)
    assert peak.peak_requested_bytes == 1000 + 3 * MIB + 1 + 5 * MIB + 3  # requested sizes: no rounding
    assert peak.peak_requested_bytes <= torch.cuda.max_memory_allocated()
    del kept, b, c
