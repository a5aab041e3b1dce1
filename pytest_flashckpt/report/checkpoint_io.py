"""Checkpoint I/O: how long a save blocks training (stall) beside how long until it is durable (total) and what it
costs the training loop (time lost per save, K steps with a save minus K without, where measured), the
write throughput beside the raw disk bandwidth and memory-copy bandwidth measured in the same run and folder
(so a slow save can be told from a slow disk), load time, files, and the memory a save adds."""

from __future__ import annotations

from pytest_flashckpt.report import select
from pytest_flashckpt.report.format import count, gbps, mbps, mib, ms, pct, ratio
from pytest_flashckpt.report.tables import Footnotes, table
from pytest_flashckpt.core.result import Result

TIMING_HEADERS = [
    "scenario", "save strategy", "stall", "total", "stall / copy (gated)", "stall / sync save", "reference sync total", "time lost per save",
    "time lost / sync's", "copy bound", "load",
]
IO_HEADERS = [
    "scenario", "written", "files", "write", "raw disk write", "write / raw", "staging copy", "memory copy",
    "staging / memory copy", "extra memory during save",
]


def _rows(r: Result, notes: Footnotes) -> tuple[list[str], list[str]]:
    name = f"`{r.id}`"
    if r.status != "measured":
        skipped = notes.skipped(r.status, r.reason)
        return [name, select.describe_save(r), skipped], [name, skipped]  # table() fills the rest with MISSING
    timing = [
        name, select.describe_save(r), ms(r.number("save_stall_s")), ms(r.number("save_total_s")),
        ratio(r.number("stall_vs_copy")), pct(r.number("stall_vs_sync")), ms(r.number("reference_save_total_s")), ms(r.number("time_lost_s")),
        ratio(r.number("time_lost_vs_sync")), ms(r.number("copy_bound_s")), ms(r.number("load_s")),
    ]
    io = [
        name, mib(r.number("bytes_written")), count(r.number("files")), mbps(r.number("write_MBps")),
        mbps(r.number("raw_write_MBps")), pct(r.number("write_vs_raw")), gbps(r.number("staging_GBps")),
        gbps(r.number("copy_GBps")), pct(r.number("staging_vs_copy")), mib(r.number("save_extra_peak_bytes")),
    ]
    return timing, io


def checkpoint_section(results: list[Result]) -> list[str]:
    lines = ["## Checkpoint I/O", ""]
    chosen = select.checkpoint_results(results)
    if not chosen:
        lines.append("_No scenario with a save strategy (checkpoint strategy other than `none`) ran in this suite._")
        return lines
    notes = Footnotes()
    pairs = [_rows(r, notes) for r in chosen]
    lines += [
        table([p[0] for p in pairs], TIMING_HEADERS),
        "",
        table([p[1] for p in pairs], IO_HEADERS),
        *notes.lines(),
        "",
        "Stall = time the training loop was blocked by a save (incl. waiting for the previous async save); total = "
        "until the checkpoint is durable and committed; medians over the scenario's saves. Stall / copy (the gated "
        "stall, staged saves only) = each save's stall over a blocking staging copy of the same state timed just "
        "before it, saves 2..n (the first allocates the staging buffers). Stall / sync save = "
        "stall against the total of a plain synchronous save of the reference (a separate pass; not gated). Raw disk write (fdatasync'd) and "
        "memory copy are this machine's limits, measured in the same run and folder; write / raw and staging / memory copy "
        "are each save's rate against its limit (staging copy = snapshot bytes / the blocking staging copy timed before "
        "each staged save; memory copy = host to host on a CPU, device to pinned host on a GPU; staged saves only).",
    ]
    return lines
