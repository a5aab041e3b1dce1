"""Per-rank measurements (``rank-<r>.json``) -> one scenario ``Result``.

The slowest rank sets the pace of a data-parallel step, so step time and save stall/total per round or save are
the maximum over ranks (then the median over rounds or saves); peak memory is reported as the maximum over ranks
(what the largest device must hold) and per rank, forward + backward and optimizer step apart, with the largest
all-gather a rank saw (on gloo, the bound of what its uncounted staging adds: ``distributed.memory``); bytes written are summed over ranks and kept per rank.
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
    metrics, samples = result.metrics, result.samples
    metrics["world_size"] = len(ranks)
    first = ranks[0]
    result.backend, result.kernel = first.get("backend"), first.get("kernel")
    result.notes.append(f"activation (every rank): {first.get('activation')}")
    if "peak_bytes" in first:
        peaks = [r["peak_bytes"] for r in ranks]
        samples["peak_bytes_per_rank"] = peaks
        samples["state_bytes_per_rank"] = [r["state_bytes"] for r in ranks]
        metrics["peak_bytes"] = max(peaks)
        metrics["peak_bytes_min_rank"] = min(peaks)
        metrics["state_bytes"] = max(samples["state_bytes_per_rank"])
        samples["fwd_bwd_peak_bytes_per_rank"] = [r["fwd_bwd_peak_bytes"] for r in ranks]
        metrics["fwd_bwd_peak_bytes"] = max(samples["fwd_bwd_peak_bytes_per_rank"])
        samples["optimizer_peak_bytes_per_rank"] = [r["optimizer_peak_bytes"] for r in ranks]
        metrics["optimizer_peak_bytes"] = max(samples["optimizer_peak_bytes_per_rank"])
        if "largest_allgather_bytes" in first:  # records before the rank probe counted local shards lack it
            metrics["largest_allgather_bytes"] = max(r["largest_allgather_bytes"] for r in ranks)
    if "step_time_s" in first:
        per_round = [max(r["step_time_s"][i] for r in ranks) for i in range(len(first["step_time_s"]))]
        samples["step_time_s"] = per_round
        samples["step_time_s_per_rank"] = [_median(r["step_time_s"]) for r in ranks]
        metrics["step_time_s"] = _median(per_round)
    if "saves" in first:
        n = len(first["saves"])
        stalls = [max(r["saves"][i]["stall_s"] for r in ranks) for i in range(n)]
        totals = [max(r["saves"][i]["total_s"] for r in ranks) for i in range(n)]
        samples["save_stall_s"], samples["save_total_s"] = stalls, totals
        metrics["save_stall_s"], metrics["save_total_s"] = _median(stalls), _median(totals)
        per_rank_bytes = [int(_median([s["bytes"] for s in r["saves"]])) for r in ranks]
        samples["bytes_written_per_rank"] = per_rank_bytes
        metrics["bytes_written"] = sum(per_rank_bytes)
        staged = [max(s["staged_bytes"] for s in r["saves"]) for r in ranks]
        samples["async_staged_bytes_per_rank"] = staged
        metrics["async_staged_bytes"] = sum(staged)  # staging copies on every rank add up on a shared host
        rss = [max(s["host_bytes_added"] for s in r["saves"]) for r in ranks]
        samples["async_rss_added_bytes_per_rank"] = rss
        metrics["async_rss_added_bytes"] = sum(rss)
        metrics["load_s"] = max(r["load_s"] for r in ranks)
        metrics["roundtrip_differences"] = first["roundtrip_differences"]
        if first["roundtrip_differences"]:
            result.status = "error"
            result.reason = (
                f"{first['roundtrip_differences']} of {first['roundtrip_tensors']} tensors loaded back from the last sharded "
                "checkpoint differ from the gathered original"
            )
