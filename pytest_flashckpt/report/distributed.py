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

from pytest_flashckpt.config.layout import Layout
from pytest_flashckpt.report.format import MISSING, count, mib, ms
from pytest_flashckpt.report.tables import Footnotes, table
from pytest_flashckpt.core.result import Result
from pytest_flashckpt.core.registry import ACTIVATION_STRATEGIES

HEADERS = ["scenario", "ranks", "layout", "save", "peak (max rank)", "peak per rank", "fwd+bwd / optimizer peak", "step", "stall", "total", "bytes per rank", "async staged (RSS added)", "load", "round trip"]


def _per_rank(r: Result, metric: str, fmt) -> str:
    values = r.per_rank.get(metric)
    return " / ".join(fmt(v) for v in values) if values else MISSING


def _save(r: Result) -> str:
    save = r.config.save
    if save.strategy != "dcp":
        return MISSING
    return "dcp.async_save" if save.async_save else "dcp.save"


def _laid_out(r: Result) -> bool:
    """A layout other than FSDP over every rank: tensor parallel, pipeline stages, context parallel or HSDP."""
    layout = r.config.layout
    return layout.tensor_parallel or layout.pp > 1 or layout.cp > 1 or layout.dp_replicate > 1


def _by_the_engine(r: Result) -> bool:
    """Whether the rank is simulated by the engine it ran (``simulate.fake_ranks``, ``simulate.pipeline``): a laid-out
    rank, or a compiled one (FSDP alone too: its compiled regions are Inductor's, which no meta step models)."""
    return _laid_out(r) or r.config.compile.enabled


def _layout(r: Result) -> str:
    """``FSDP over N`` (every rank shards), or the ranks per axis of a layout (with a pipeline's schedule)."""
    c = r.config
    compiled = f", compiled per {c.compile.scope}" if c.compile.enabled else ""
    if not _laid_out(r):
        return f"FSDP over {c.world_size}{compiled}"
    if c.layout.pp > 1:
        compiled = f", {c.layout.pipeline_schedule().describe()}{compiled}"
    return f"{c.parallel_layout.describe()}{compiled}"


def _roundtrip(r: Result) -> str:
    diff = r.number("roundtrip_differences")
    return MISSING if diff is None else ("bitwise" if diff == 0 else f"{count(diff)} tensors differ")




@functools.lru_cache(maxsize=64)
def _simulate(card: str, dtype: str, batch: int, seq: int, kernel: str, strategy: str, k: int, target: str, world: int) -> int:
    from pytest_flashckpt.simulate import simulate_step  # torch on meta: only when a distributed row is rendered

    return simulate_step(card, dtype, batch, seq, kernel, strategy, k=k, target=target, world_size=world).peak_bytes


@functools.lru_cache(maxsize=64)
def _simulate_layout(card: str, dtype: str, precision: str, batch: int, seq: int, strategy: str, k: int,
                     layout: Layout, seed: int, compile=None, budget: float | None = None,
                     rank: int = 0) -> tuple[int, int, int]:
    import torch

    from pytest_flashckpt.models.cards import load_card
    from pytest_flashckpt.simulate.fake_ranks import simulate_rank  # the real engine under fake mode

    record = simulate_rank(load_card(card), layout, batch_size=batch, seq_len=seq,
                           strategy=strategy, k=k, dtype=getattr(torch, dtype), precision=precision, seed=seed,
                           compile=compile, budget=budget, rank=rank)
    return record["peak_bytes"], record["fwd_bwd_start_bytes"], record["optimizer_peak_bytes"]


@functools.lru_cache(maxsize=64)
def _simulate_stage_rank(card: str, dtype: str, precision: str, batch: int, seq: int, strategy: str, k: int,
                         layout: Layout, schedule: str, microbatches: int, stages_per_rank: int,
                         seed: int, *, rank: int, compile=None) -> tuple[int, int, int]:
    import torch

    from pytest_flashckpt.config.layout import PipelineSchedule
    from pytest_flashckpt.models.cards import load_card
    from pytest_flashckpt.simulate.pipeline import simulate_pipeline_rank  # torch's schedule under fake mode

    record = simulate_pipeline_rank(load_card(card), layout,
                                    PipelineSchedule(schedule, microbatches, stages_per_rank), batch_size=batch,
                                    seq_len=seq, strategy=strategy, k=k, dtype=getattr(torch, dtype),
                                    precision=precision, seed=seed, rank=rank, compile=compile)
    return record["peak_bytes"], record["fwd_bwd_start_bytes"], record["optimizer_peak_bytes"]


def engine_ranks(r: Result) -> tuple[list[tuple[int, int, int]] | None, str]:
    """Every measured rank of a laid-out result simulated by the engine: (peak, state at the step's start,
    optimizer peak) per rank, in rank order (a tensor-parallel layout's ranks hold alike: one simulation; a pipeline's
    ranks hold their own stages and a context-parallel rank its own chunks of the ring: each simulated), or None and
    why not."""
    c = r.config
    if c.layout.cp > 1 and c.layout.pp == 1:  # (cp inside stages: each stage rank below, its own chunks too)
        records = [engine_rank(r, rank) for rank in range(c.world_size)]
        why = next((why for record, why in records if record is None), None)
        return (None, why) if why is not None else ([record for record, _ in records], "")
    if c.layout.pp == 1:
        record, why = engine_rank(r)
        return (None, why) if record is None else ([record] * c.world_size, "")
    why = _engine_refusal(r)
    if why is not None:
        return None, why
    layout, pipeline = c.parallel_layout, c.layout.pipeline_schedule()
    try:
        return [_simulate_stage_rank(c.card, c.dtype, c.precision, c.batch_size, c.seq_len, c.activation.strategy,
                                     c.activation.k, layout, pipeline.schedule, pipeline.microbatches,
                                     pipeline.stages_per_rank, c.seed, rank=rank,
                                     compile=c.compile if c.compile.enabled else None)
                for rank in range(c.world_size)], ""
    except (ValueError, KeyError, FileNotFoundError) as exc:
        return None, f"not simulated: {exc}"


def _engine_refusal(r: Result) -> str | None:
    """Why the engine cannot simulate the ranks of ``r`` (its strategy, a dropout override, another op or device)."""
    from pytest_flashckpt.simulate.layouts import LAYOUT_STRATEGIES

    c = r.config
    if c.activation.strategy not in LAYOUT_STRATEGIES:
        return f"the {c.activation.strategy} strategy is not simulated by the engine yet"
    if c.model.hf is not None:
        return "a Hugging Face model's rank is not laid out by the engine here"
    if c.model.dropout or r.backend not in ("sdpa", "sdpa-flash-cpu", None) or not str(r.device or "").startswith("cpu"):
        return "the engine's rank runs the card's step with the CPU sdpa op (no dropout override, a CPU run)"
    return None


def simulated_rank_peak(r: Result) -> tuple[int | None, str]:
    """The simulator's per-rank peak for a measured distributed result, or None and why not. A tensor-parallel
    layout's rank is simulated by the engine the ranks ran (``parallelize_module`` + ``fully_shard`` under fake
    mode, ``simulate.fake_ranks``: the same AdamW pick as the CPU rank), and so is a compiled rank, FSDP alone
    included (compiled under fake mode into Inductor's plans); an eager rank of FSDP over every rank by the modelled
    meta step (``simulate_step`` with ``world_size``)."""
    c = r.config
    strategy = c.activation.strategy
    if _by_the_engine(r):
        records, why = engine_ranks(r)
        return (None, why) if records is None else (max(peak for peak, _, _ in records), "")
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


def engine_rank(r: Result, rank: int = 0) -> tuple[tuple[int, int, int] | None, str]:
    """A laid-out result's rank ``rank`` simulated by the engine: (peak, state at the step's start, optimizer
    peak) in bytes, or None and why not."""
    c = r.config
    why = _engine_refusal(r)
    if why is not None:
        return None, why
    layout = c.parallel_layout
    try:
        compiled = c.compile if c.compile.enabled else None  # a compiled rank: the engine compiled under fake mode
        budget = c.activation.budget if c.activation.strategy == "compile_budget" else None
        return _simulate_layout(c.card, c.dtype, c.precision, c.batch_size, c.seq_len, c.activation.strategy,
                                c.activation.k, layout, c.seed, compiled, budget, rank), ""
    except (ValueError, KeyError, FileNotFoundError) as exc:
        return None, f"not simulated: {exc}"


def _exact_windows(r: Result) -> str:
    """For an engine-simulated layout: the state at the step's start and the optimizer step's peak, simulated
    against every measured rank (equal to the byte when the engine's rank holds what the gloo rank holds)."""
    if not _by_the_engine(r):
        return MISSING
    records, _ = engine_ranks(r)
    if records is None:
        return MISSING
    measured = list(zip(r.per_rank.get("state_bytes", []), r.per_rank.get("optimizer_peak_bytes", [])))
    if not measured or len(measured) != len(records):
        return MISSING
    off = [(a - start, b - optimizer) for (a, b), (_, start, optimizer) in zip(measured, records) if (a, b) != (start, optimizer)]
    if not off:
        return f"equal to the byte ({len(measured)} ranks)"
    return "; ".join(f"{d_start:+d} B / {d_opt:+d} B" for d_start, d_opt in off) + " (measured - simulated)"


def _staging_factor() -> int:
    from pytest_flashckpt.distributed.memory import GLOO_STAGING_FACTOR  # imports torch: only for a distributed row

    return GLOO_STAGING_FACTOR


def _probed_peak(r: Result) -> int | None:
    """The rank's peak as the rank probe read it: the row's peak, but for a compiled rank (whose row's peak is the
    allocator's) the larger of its two probed windows where it has them (tensor parallel: ``distributed.rank``)."""
    windows = [r.number("fwd_bwd_peak_bytes"), r.number("optimizer_peak_bytes")]
    if r.config.compile.enabled and None not in windows:
        return max(windows)  # type: ignore[type-var]
    return r.number("peak_bytes")


def comparison_section(chosen: list[Result]) -> list[str]:
    notes = Footnotes()
    rows = []
    for r in chosen:
        measured = _probed_peak(r)
        if r.status != "measured" or measured is None:
            continue
        simulated, why = simulated_rank_peak(r)
        diff = MISSING if simulated is None else f"{(simulated - measured) / measured * 100:+.1f}%"
        staging = r.number("largest_allgather_bytes")
        bound = f"≤ {mib(_staging_factor() * staging)}" if staging and "gloo" in str(r.device) else MISSING
        rows.append([f"`{r.id}`", mib(measured), mib(simulated) if simulated is not None else notes.skipped("not simulated", why), diff,
                     _exact_windows(r), bound])
    if not rows:
        return []
    return [
        "", "Per-rank peak, measured (largest rank) beside simulated: FSDP over every rank by `simulate_step` with "
        "`world_size` (FSDP2's reduce-scatter buffers and shard padding not modelled); a tensor-parallel layout by the "
        "engine the ranks ran, under fake mode (`simulate.fake_ranks`; pipeline stages by torch's schedule under fake "
        "mode, `simulate.pipeline`, every rank its own stages; the forward+backward peak of a gloo rank is "
        "higher by what gloo's thread still holds of finished collectives, docs/layouts.md); a compiled "
        "rank (FSDP alone or tensor parallel) by the same engine compiled under fake mode with Inductor's own memory plans, against "
        "the rank probe run under compiled code (the row's peak elsewhere is the allocator's, gloo's staging "
        "included; reports/spike-compiled-fake-ranks.md sizes both gaps). *gloo staging*: what "
        "gloo's uncounted copies of an in-flight all-gathers may add to the allocator's view on a CPU rank (up to 4 x "
        "the largest all-gather). *state / optimizer peak*: for an engine-simulated layout, the rank's state at the "
        "step's start and its optimizer-step peak, simulated against every measured rank.", "",
        table(rows, ["scenario", "measured peak", "simulated peak", "simulated - measured", "state / optimizer peak", "gloo staging"]),
        *notes.lines(),
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
            rows.append([name, ranks, _layout(r), _save(r), notes.skipped(r.status, r.reason), *[MISSING] * 9])
            continue
        rows.append([
            name, ranks, _layout(r), _save(r), mib(r.number("peak_bytes")), _per_rank(r, "peak_bytes", mib),
            f"{mib(r.number('fwd_bwd_peak_bytes'))} / {mib(r.number('optimizer_peak_bytes'))}",
            ms(r.number("step_time_s")), ms(r.number("save_stall_s")), ms(r.number("save_total_s")),
            _per_rank(r, "bytes_written", mib), f"{mib(r.number('async_staged_bytes'))} ({mib(r.number('async_rss_added_bytes'))})" if r.number("async_staged_bytes") else MISSING, ms(r.number("load_s")), _roundtrip(r),
        ])  # fmt: skip
    lines.append(
        "Ranks under torchrun, model sharded with FSDP2 (`fully_shard` per block and root) over every rank, or laid "
        "out dp_shard x tp (tensor + sequence parallel by `parallelize_module` on a 2D `DeviceMesh`, then FSDP2 over "
        "dp_shard), or split into pipeline stages (`torch.distributed.pipelining`, one schedule step over the "
        "microbatches; a stage's ranks hold its own blocks, so per-rank peaks differ); saves are sharded DCP checkpoints committed with one manifest. Step, stall and total: slowest "
        "rank, median over rounds or saves."
    )
    return [*lines, "", table(rows, HEADERS), *notes.lines(), *comparison_section(chosen)]
