"""Per-rank measurements (``rank-<r>.json``) -> one scenario ``Result``.

The slowest rank sets the pace of a data-parallel step, so step time and save stall/total per round or save are
the maximum over ranks (then the median over rounds or saves); peak memory is reported as the maximum over ranks
(what the largest device must hold) and per rank, forward + backward and optimizer step apart, with the largest
all-gather a rank saw (on gloo, the bound of what its uncounted staging adds: ``distributed.memory``); bytes written are summed over ranks and kept per rank.
Every value is written through ``Result.record`` under the vocabulary's name, per-rank values in ``Result.per_rank``
and per-round (per-save) values in ``Result.samples``, both under the metric's name.
"""

from __future__ import annotations

import statistics
from typing import Any

from pytest_flashckpt.core.result import Result


def _median(values: list[float]) -> float:
    return statistics.median(values)


def aggregate(result: Result, ranks: list[dict[str, Any]]) -> None:
    """Fill ``result`` (metrics, samples, notes, status) from every rank's record, ordered by rank."""
    ranks = sorted(ranks, key=lambda r: r["rank"])
    bad = [r for r in ranks if r.get("status") != "measured"]
    if bad:
        result.status = "skipped" if all(r.get("status") == "skipped" for r in bad) else "error"
        result.reason = f"rank {bad[0]['rank']}: {bad[0].get('reason')}"
        result.notes.extend(r["traceback"] for r in bad if r.get("traceback"))
        return
    first = ranks[0]
    result.record("world_size", len(ranks))
    result.backend, result.kernel = first.get("backend"), first.get("kernel")
    if len({r.get("activation") for r in ranks}) == 1:
        result.notes.append(f"activation (every rank): {first.get('activation')}")
    else:  # pipeline stages: each rank wraps its own stages' blocks
        result.notes.append("activation: " + "; ".join(f"rank {r['rank']}: {r.get('activation')}" for r in ranks))
    if first.get("layout"):  # records before layouts were measured lack it (FSDP over every rank)
        result.notes.append(f"layout: {first['layout']}")
    if "peak_bytes" in first:
        peaks = [r["peak_bytes"] for r in ranks]
        result.record("peak_bytes", max(peaks), per_rank=peaks)
        result.record("peak_bytes_min_rank", min(peaks))
        for name in ("state_bytes", "fwd_bwd_peak_bytes", "optimizer_peak_bytes"):
            if name not in first:  # a compiled rank's peak is one step's (allocator events), not two windows
                continue
            values = [r[name] for r in ranks]
            result.record(name, max(values), per_rank=values)
        if first.get("peak_source") == "allocator":
            result.probe = "allocator"
            result.notes.append("peak: the CPU allocator's events of one compiled step per rank (the cpu probe, a "
                                "dispatch mode, would run it eager)")
        if "largest_allgather_bytes" in first:  # records before the rank probe counted local shards lack it
            result.record("largest_allgather_bytes", max(r["largest_allgather_bytes"] for r in ranks))
    if "compile_time_s" in first:  # a compiled rank: its first step compiled; graphs compiled after warm-up
        result.record("compile_time_s", max(r["compile_time_s"] for r in ranks))
        regions = [r["compiled_regions"] for r in ranks]  # pipeline ranks compile their own stages' blocks
        result.record("compiled_regions", first["compiled_regions"], per_rank=regions)
        recompiles = max(r["recompiles"] for r in ranks)
        result.record("recompiles", recompiles)
        if recompiles:
            result.notes.append(f"compile: {recompiles} graph(s) compiled after the warm-up on some rank (recompiles)")
    if "step_time_s" in first:
        per_round = [max(r["step_time_s"][i] for r in ranks) for i in range(len(first["step_time_s"]))]
        result.record("step_time_s", _median(per_round), samples=per_round,
                      per_rank=[_median(r["step_time_s"]) for r in ranks])
    if "saves" in first:
        n = len(first["saves"])
        for name in ("save_stall_s", "save_total_s"):  # the slowest rank's, save by save
            slowest = [max(r["saves"][i][name] for r in ranks) for i in range(n)]
            result.record(name, _median(slowest), samples=slowest)
        per_rank_bytes = [int(_median([s["bytes_written"] for s in r["saves"]])) for r in ranks]
        result.record("bytes_written", sum(per_rank_bytes), per_rank=per_rank_bytes)
        for name in ("async_staged_bytes", "async_rss_added_bytes"):  # copies on every rank add up on a shared host
            largest = [max(s[name] for s in r["saves"]) for r in ranks]
            result.record(name, sum(largest), per_rank=largest)
        result.record("load_s", max(r["load_s"] for r in ranks))
        result.record("roundtrip_differences", first["roundtrip_differences"])
        if first["roundtrip_differences"]:
            result.status = "error"
            result.reason = (
                f"{first['roundtrip_differences']} of {first['roundtrip_tensors']} tensors loaded back from the last sharded "
                "checkpoint differ from the gathered original"
            )
