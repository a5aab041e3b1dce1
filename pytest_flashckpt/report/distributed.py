"""Distributed scenarios (``world_size > 1``): per-rank and aggregated numbers from the torchrun ranks.

Step time and save stall/total are the slowest rank's (a data-parallel step waits for it). Peak memory is the
largest rank's with every rank listed, split into forward + backward (where activation strategies act) and the
optimizer step (AdamW temporaries on the shards can set the peak; then activation strategies do not move it).
Bytes are per rank. Async staged is the host copy ``dcp.async_save`` makes of every rank's state before returning,
summed over ranks (ranks on one host share its RAM), with the resident-set growth measured around it in brackets.
The round-trip column counts tensors of the last checkpoint, loaded back into fresh sharded trainers, that differ
in any bit (0 is correct).
"""

from __future__ import annotations

from pytest_flashckpt.report.format import MISSING, count, mib, ms
from pytest_flashckpt.report.tables import Footnotes, table
from pytest_flashckpt.result import Result

HEADERS = ["scenario", "ranks", "save", "peak (max rank)", "peak per rank", "fwd+bwd / optimizer peak", "step", "stall", "total", "bytes per rank", "async staged (RSS added)", "load", "round trip"]


def _num(r: Result, key: str) -> float | None:
    value = r.metrics.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _per_rank(r: Result, key: str, fmt) -> str:
    values = r.samples.get(key)
    return " / ".join(fmt(v) for v in values) if values else MISSING


def _save(r: Result) -> str:
    ckpt = r.config.get("checkpoint", {})
    if ckpt.get("strategy") != "dcp":
        return MISSING
    return "dcp.async_save" if ckpt.get("async_save") else "dcp.save"


def _roundtrip(r: Result) -> str:
    diff = _num(r, "roundtrip_differences")
    return MISSING if diff is None else ("bitwise" if diff == 0 else f"{count(diff)} tensors differ")


def distributed_results(results: list[Result]) -> list[Result]:
    return [r for r in results if int(r.config.get("world_size", 1) or 1) > 1]


def distributed_section(results: list[Result]) -> list[str]:
    lines = ["## Distributed (FSDP2 + torch.distributed.checkpoint)", ""]
    chosen = distributed_results(results)
    if not chosen:
        return [*lines, "_No distributed scenario (world_size > 1) in this run._"]
    notes = Footnotes()
    rows = []
    for r in chosen:
        name = f"`{r.id}`"
        ranks = str(r.config.get("world_size"))
        if r.status != "measured":
            rows.append([name, ranks, _save(r), notes.skipped(r.status, r.reason), *[MISSING] * 9])
            continue
        rows.append([
            name, ranks, _save(r), mib(_num(r, "peak_bytes")), _per_rank(r, "peak_bytes_per_rank", mib),
            f"{mib(_num(r, 'fwd_bwd_peak_bytes'))} / {mib(_num(r, 'optimizer_peak_bytes'))}",
            ms(_num(r, "step_time_s")), ms(_num(r, "save_stall_s")), ms(_num(r, "save_total_s")),
            _per_rank(r, "bytes_written_per_rank", mib), f"{mib(_num(r, 'async_staged_bytes'))} ({mib(_num(r, 'async_rss_added_bytes'))})" if _num(r, "async_staged_bytes") else MISSING, ms(_num(r, "load_s")), _roundtrip(r),
        ])  # fmt: skip
    lines.append(
        "Ranks under torchrun, model sharded with FSDP2 (`fully_shard` per block and root); saves are sharded DCP "
        "checkpoints committed with one manifest. Step, stall and total: slowest rank, median over rounds or saves."
    )
    return [*lines, "", table(rows, HEADERS), *notes.lines()]
