"""Distributed scenarios (``world_size > 1``): per-rank and aggregated numbers from the torchrun ranks.

Step time and save stall/total are the slowest rank's (a data-parallel step waits for it). Peak memory is the
largest rank's with every rank listed, split into forward + backward (where activation strategies act) and the
optimizer step (AdamW on the rank's local shards). Both count what the rank holds: DTensors as their local shards,
all-gathered parameters while they live (``distributed.memory``).
Bytes are per rank. Async staged is the host copy ``dcp.async_save`` makes of every rank's state before returning,
summed over ranks (ranks on one host share its RAM), with the resident-set growth measured around it in brackets.
The round-trip column counts tensors of the last checkpoint, loaded back into fresh sharded trainers, that differ
in any bit (0 is correct).

A second table puts each measured per-rank peak beside the simulator's (``simulate_step`` with ``world_size``, the
same card, batch, sequence, dtype and strategy): the simulator models FSDP2's gathered parameters as the root's and
two blocks' and shards everything else 1/N; it does not model the reduce-scatter buffers or shard padding, so the
difference is shown, not hidden (``tests/distributed/test_rank_memory.py`` measures it on cards of odd sizes).
"""

from __future__ import annotations

import functools

from pytest_flashckpt.report.format import MISSING, count, mib, ms
from pytest_flashckpt.report.tables import Footnotes, table
from pytest_flashckpt.core.result import Result
from pytest_flashckpt.core.registry import ACTIVATION_STRATEGIES

HEADERS = ["scenario", "ranks", "save", "peak (max rank)", "peak per rank", "fwd+bwd / optimizer peak", "step", "stall", "total", "bytes per rank", "async staged (RSS added)", "load", "round trip"]


def _per_rank(r: Result, metric: str, fmt) -> str:
    values = r.per_rank.get(metric)
    return " / ".join(fmt(v) for v in values) if values else MISSING


def _save(r: Result) -> str:
    save = r.config.save
    if save.strategy != "dcp":
        return MISSING
    return "dcp.async_save" if save.async_save else "dcp.save"


def _roundtrip(r: Result) -> str:
    diff = r.number("roundtrip_differences")
    return MISSING if diff is None else ("bitwise" if diff == 0 else f"{count(diff)} tensors differ")




@functools.lru_cache(maxsize=64)
def _simulate(card: str, dtype: str, batch: int, seq: int, kernel: str, strategy: str, k: int, target: str, world: int) -> int:
    from pytest_flashckpt.simulate import simulate_step  # torch on meta: only when a distributed row is rendered

    return simulate_step(card, dtype, batch, seq, kernel, strategy, k=k, target=target, world_size=world).peak_bytes


def simulated_rank_peak(r: Result) -> tuple[int | None, str]:
    """The simulator's per-rank peak for a measured distributed result, or None and why not."""
    c = r.config
    strategy = c.activation.strategy
    spec = ACTIVATION_STRATEGIES.get(strategy)  # simulated here: the registry's strategies that need no budget plan
    if spec is None or spec.not_simulated or spec.takes_budget:
        return None, f"the {strategy} strategy is not simulated here"
    target = "cuda" if str(r.device or "").startswith("cuda") else "cpu"
    kernel = "eager" if r.backend == "eager" else ("sdpa" if target == "cpu" else "flash")
    if c.model.dropout:
        return None, "dropout overrides are not simulated here"
    try:
        peak = _simulate(c.card, c.dtype, c.batch_size, c.seq_len, kernel, strategy, c.activation.k, target, c.world_size)
    except (ValueError, KeyError, FileNotFoundError) as exc:
        return None, f"not simulated: {exc}"
    return peak, ""


def _staging_factor() -> int:
    from pytest_flashckpt.distributed.memory import GLOO_STAGING_FACTOR  # imports torch: only for a distributed row

    return GLOO_STAGING_FACTOR


def comparison_section(chosen: list[Result]) -> list[str]:
    notes = Footnotes()
    rows = []
    for r in chosen:
        measured = r.number("peak_bytes")
        if r.status != "measured" or measured is None:
            continue
        simulated, why = simulated_rank_peak(r)
        diff = MISSING if simulated is None else f"{(simulated - measured) / measured * 100:+.1f}%"
        staging = r.number("largest_allgather_bytes")
        bound = f"≤ {mib(_staging_factor() * staging)}" if staging and "gloo" in str(r.device) else MISSING
        rows.append([f"`{r.id}`", mib(measured), mib(simulated) if simulated is not None else notes.skipped("not simulated", why), diff, bound])
    if not rows:
        return []
    return [
        "", "Per-rank peak, measured (largest rank) beside simulated (`simulate_step` with `world_size`; FSDP2's "
        "reduce-scatter buffers and shard padding not modelled). *gloo staging*: what gloo's uncounted copies of an "
        "in-flight all-gathers may add to the allocator's view on a CPU rank (up to 4 x the largest all-gather).", "",
        table(rows, ["scenario", "measured peak", "simulated peak", "simulated - measured", "gloo staging"]), *notes.lines(),
    ]


def distributed_results(results: list[Result]) -> list[Result]:
    return [r for r in results if r.config.world_size > 1]


def distributed_section(results: list[Result]) -> list[str]:
    lines = ["## Distributed (FSDP2 + torch.distributed.checkpoint)", ""]
    chosen = distributed_results(results)
    if not chosen:
        return [*lines, "_No distributed scenario (world_size > 1) in this run._"]
    notes = Footnotes()
    rows = []
    for r in chosen:
        name = f"`{r.id}`"
        ranks = str(r.config.world_size)
        if r.status != "measured":
            rows.append([name, ranks, _save(r), notes.skipped(r.status, r.reason), *[MISSING] * 9])
            continue
        rows.append([
            name, ranks, _save(r), mib(r.number("peak_bytes")), _per_rank(r, "peak_bytes", mib),
            f"{mib(r.number('fwd_bwd_peak_bytes'))} / {mib(r.number('optimizer_peak_bytes'))}",
            ms(r.number("step_time_s")), ms(r.number("save_stall_s")), ms(r.number("save_total_s")),
            _per_rank(r, "bytes_written", mib), f"{mib(r.number('async_staged_bytes'))} ({mib(r.number('async_rss_added_bytes'))})" if r.number("async_staged_bytes") else MISSING, ms(r.number("load_s")), _roundtrip(r),
        ])  # fmt: skip
    lines.append(
        "Ranks under torchrun, model sharded with FSDP2 (`fully_shard` per block and root); saves are sharded DCP "
        "checkpoints committed with one manifest. Step, stall and total: slowest rank, median over rounds or saves."
    )
    return [*lines, "", table(rows, HEADERS), *notes.lines(), *comparison_section(chosen)]
