"""``flashckpt simulate ... --world-size N [--tp T]``: the per-rank peak of a dp_shard x tp layout (FSDP2 alone at
tp 1), from the real engine under fake mode (``simulate.fake_ranks``), for the command line.

    flashckpt simulate --model llama3-8b --seq 8192 --batch 8 --strategy full --world-size 8 --tp 2
    flashckpt simulate --model llama3-70b --seq 8192 --batch 8 --strategy full --world-size 8 --precision mixed

What the engine does not run (``engine_cannot_run``: a Hugging Face config, a strategy whose registry row does not
set ``runs_on_fake_ranks`` (budget, offload, compile_budget: ``core.registry``), another attention
kernel or target, another norm, optimizer or loss) stays with the modelled FSDP route at tp 1 (``simulate.fsdp``:
the step at batch / N plus a formula for the all-gathered blocks) and is refused under tensor parallel.

Every input is checked before anything is built (``config.layout``: heads divisible by tp, world by tp, batch by
dp_shard); an error is one line naming the option and the fix. The fake rank runs torch's CPU flash-attention op
and the multi-tensor (foreach) AdamW CUDA defaults to, so the answer is the live tensors of a rank with those;
the CUDA allocator's extra (workspaces, rounding, fragmentation) is not counted, as for the meta simulation.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

from pytest_flashckpt.config.errors import InputError
from pytest_flashckpt.config.layout import Layout
from pytest_flashckpt.config.step_impl import StepImpl
from pytest_flashckpt.core.registry import NOT_ON_FAKE_RANKS, fake_rank_strategies
from pytest_flashckpt.simulate.devices import REPORT_DEVICES, gib, parse_device_memory, verdict
from pytest_flashckpt.simulate.workload import check_workload, dtype_name

LAYOUT_STRATEGIES = fake_rank_strategies()  # the registry's rows with runs_on_fake_ranks
CUDA_ADAMW_FOREACH = True  # a --target cuda answer runs the multi-tensor AdamW CUDA defaults to (its temporaries)


def engine_cannot_run(args: argparse.Namespace) -> str | None:
    """The option the real engine under fake mode does not simulate (one line with the reason), or None."""
    if args.hf_config is not None or args.model.endswith(".json"):
        return f"--hf-config/--model {args.hf_config or args.model}: a Hugging Face model's rank is not laid out by the engine here"
    if args.budget is not None or args.strategy not in LAYOUT_STRATEGIES:
        return (f"--strategy {'budget' if args.budget else args.strategy} is not simulated by the engine yet "
                f"({NOT_ON_FAKE_RANKS}); use one of {', '.join(LAYOUT_STRATEGIES)}")
    if args.kernel != "flash" or args.target != "cuda":
        return (f"--kernel {args.kernel} --target {args.target}: the engine's rank runs the CPU flash-attention op "
                "(the default --kernel flash --target cuda request)")
    if args.norm is not None or args.optimizer != "adamw" or args.loss != "plain":
        return "--norm/--optimizer/--loss: the engine's rank runs the card's norm, AdamW (foreach) and the plain loss"
    return None


def check_args(args: argparse.Namespace):
    """The card and layout the options ask for, or an ``InputError`` naming the option (nothing is built)."""
    from pytest_flashckpt.models.cards import load_card

    refusal = engine_cannot_run(args)
    if refusal is not None:
        raise InputError(f"--tp {args.tp}: {refusal}")
    try:
        layout = Layout.for_world(args.world_size, tp=args.tp)
        card = load_card(args.model)
        layout.check_card(card)
        if layout.tp == 1:  # FSDP alone: the meta step's checks and words (world size, sequence, tensor sizes)
            check_workload(card, args.batch, args.seq, layout.world_size)
        layout.check_batch(args.batch)
        dtype = dtype_name(args.dtype)
    except FileNotFoundError as exc:
        raise InputError(f"--model {args.model}: {exc}") from None
    except ValueError as exc:
        where = f"--world-size {args.world_size}" + (f" --tp {args.tp}" if args.tp != 1 else "")
        raise InputError(f"{where}: {exc}") from None
    if layout.tp > 1:
        _check_plan(card, args.tp)
    if args.precision == "mixed" and dtype != "bfloat16":
        raise InputError(f"--precision mixed computes in bf16 over fp32 master weights; --dtype {args.dtype} has no mixed form")
    if args.seq > card.block_size:
        raise InputError(f"--seq {args.seq} exceeds block_size {card.block_size} of model card {card.name!r}; use a shorter --seq")
    return card, layout, dtype


def _check_plan(card, tp_size: int) -> None:
    """The family can be split (separate q/k/v projections, rotary positions): read off its model on meta."""
    from pytest_flashckpt.distributed.tensor_parallel import plan_refusal

    refusal = plan_refusal(card)
    if refusal is not None:
        raise InputError(f"--tp {tp_size}: model card {card.name!r}: {refusal}")


def run_layout(args: argparse.Namespace) -> int:
    import torch

    from pytest_flashckpt.simulate.fake_ranks import simulate_rank

    card, layout, dtype = check_args(args)
    device_bytes = None if args.device_memory is None else parse_device_memory(args.device_memory)
    started = time.perf_counter()
    record = simulate_rank(card, layout, batch_size=args.batch, seq_len=args.seq, strategy=args.strategy,
                           dtype=getattr(torch, dtype), precision=args.precision, k=args.k, foreach=CUDA_ADAMW_FOREACH)
    seconds = time.perf_counter() - started
    print("\n".join(describe(card, layout, args, record, seconds)))
    peak = record["peak_bytes"]
    if device_bytes is None:
        for label, size in REPORT_DEVICES:
            print(f"  on {label}: {verdict(peak, size)}")
        return 0
    print(f"device memory {args.device_memory} ({gib(device_bytes)}): {verdict(peak, device_bytes)}")
    return 0 if peak <= device_bytes else 1


def describe(card, layout: Layout, args, record: dict, seconds: float) -> list[str]:
    phase = "forward+backward" if record["fwd_bwd_peak_bytes"] >= record["optimizer_peak_bytes"] else "optimizer step"
    if layout.tp == 1:
        ranks = f"per rank of {layout.world_size} (FSDP, batch {args.batch // layout.dp_shard} per rank)"
        engine = "fully_shard"
    else:
        ranks = (f"layout {layout.describe()} ({layout.world_size} ranks, batch {args.batch // layout.dp_shard} per "
                 "data-parallel rank)")
        engine = "parallelize_module + fully_shard"
    depths = record.get("simulated_depths", [])
    how = (f"; depths {', '.join(map(str, depths))} simulated, the card's {card.n_layer} blocks read off their line"
           if record.get("extrapolated") else "")
    return [
        f"{card.name}, {args.dtype} {args.precision}, batch {args.batch} x seq {args.seq}, strategy {args.strategy}, {ranks}",
        f"per-rank peak: {gib(record['peak_bytes'])} ({record['peak_bytes']} bytes) in the {phase} "
        f"(rank 0 simulated by torch's {engine} under FakeTensorMode in {seconds:.1f} s{how})",
        f"  forward+backward  {gib(record['fwd_bwd_start_bytes']):>12} -> {gib(record['fwd_bwd_peak_bytes']):>12}",
        f"  optimizer step    {gib(record['optimizer_start_bytes']):>12} -> {gib(record['optimizer_peak_bytes']):>12}",
        "  CPU flash-attention op, AdamW foreach (CUDA's default); not counted: CUDA context, NCCL/cuBLAS workspaces, "
        "allocator rounding and fragmentation",
    ]


def engine_cannot_run_scenario(scenario) -> str | None:
    """``engine_cannot_run`` for a suite scenario with ``simulate.world_size`` > 1 (the same limits, by key)."""
    sim = scenario.simulate
    if scenario.model.hf is not None:
        return "model.hf: a Hugging Face model's rank is not laid out by the engine here"
    if scenario.activation.strategy not in LAYOUT_STRATEGIES:
        return f"activation.strategy {scenario.activation.strategy} is not simulated by the engine yet ({NOT_ON_FAKE_RANKS})"
    if sim.kernel != "flash" or sim.target != "cuda":
        return f"simulate.kernel {sim.kernel} / target {sim.target}: the engine's rank runs the CPU flash-attention op"
    if scenario.step_impl != StepImpl() or scenario.model.dropout:
        return "step_impl / model.dropout: the engine's rank runs the card's own step"
    if scenario.layout.pp > 1:
        return stages_refusal(scenario)
    return None


def stages_refusal(scenario, card=None) -> str | None:
    """Why the card (``card``, else the scenario's loaded) cannot be split into the scenario's pipeline stages
    (more stages than blocks, tensor-parallel shards that do not divide the sequence or vocabulary), or None."""
    from pytest_flashckpt.models.cards import load_card

    card, layout = card if card is not None else load_card(scenario.card), scenario.parallel_layout
    try:
        layout.check_card(card)
        scenario.layout.pipeline_schedule().check(layout, batch_size=scenario.batch_size, n_blocks=card.n_layer)
        layout.check_stage_shards(scenario.seq_len, card.vocab_size)
    except ValueError as exc:
        return str(exc)
    return None


def record_rank(scenario, result, simulate: Callable[[str], dict], started: float, start_key: str, kernel: str) -> dict:
    """Fill ``result`` with a simulated rank of ``scenario``: ``simulate(strategy)``'s record for the scenario's
    strategy (peak, start from ``start_key``) and, for a strategy, its saving against the same rank without activation
    checkpointing; the time both took, and the simulated device, probe and ``kernel``. Returns the strategy's record."""
    record = simulate(scenario.activation.strategy)
    m = result.metrics
    m["simulated_peak_bytes"] = record["peak_bytes"]
    m["simulated_start_bytes"] = record[start_key]
    m["world_size"] = scenario.parallel_layout.world_size
    if scenario.activation.strategy != "none":
        reference = simulate("none")
        m["simulated_reference_peak_bytes"] = reference["peak_bytes"]
        m["simulated_memory_saving"] = 1.0 - record["peak_bytes"] / reference["peak_bytes"]
    m["simulate_seconds"] = time.perf_counter() - started
    result.device = "meta"
    result.probe = "simulated"
    result.backend = scenario.simulate.kernel
    result.kernel = kernel
    return record


def run_engine_scenario(scenario, result) -> None:
    """Fill ``result`` with rank 0's peak of ``scenario`` (FSDP over ``simulate.world_size`` ranks, or the scenario's
    dp_shard x tp layout of them) from the real
    engine under fake mode, and its saving against the same rank without activation checkpointing. Only the live
    bytes of the two windows are simulated: no breakdown by category (the ``simulated_*_bytes`` categories stay
    unset)."""
    import torch

    from pytest_flashckpt.models.cards import load_card
    from pytest_flashckpt.simulate.fake_ranks import simulate_rank

    card = load_card(scenario.card)
    layout = scenario.parallel_layout  # FSDP over every rank unless laid out
    started = time.perf_counter()
    common = dict(batch_size=scenario.batch_size, seq_len=scenario.seq_len, k=scenario.activation.k,
                  dtype=getattr(torch, scenario.dtype), precision=scenario.precision)
    if layout.pp > 1:
        return _pipeline_scenario(scenario, result, card, layout, common, started)

    def rank(strategy: str) -> dict:
        return simulate_rank(card, layout, strategy=strategy, foreach=CUDA_ADAMW_FOREACH, **common)

    record = record_rank(scenario, result, rank, started, "fwd_bwd_start_bytes", "sdpa-flash-cpu (fake rank)")
    phase = "forward+backward" if record["fwd_bwd_peak_bytes"] >= record["optimizer_peak_bytes"] else "optimizer step"
    depths = record["simulated_depths"]
    how = f"depths {', '.join(map(str, depths))} simulated, read off their line" if record["extrapolated"] else "simulated whole"
    engine = "parallelize_module + fully_shard" if layout.tp > 1 else "fully_shard"
    if layout.cp > 1:
        engine = f"torch's ring attention over {layout.cp} cp ranks + {engine} over dp_shard x cp"
    result.notes.append(f"simulated by the real engine ({engine} under FakeTensorMode, rank 0 of {layout.describe()}; "
                        f"{how}): peak in the {phase}; CPU flash-attention op, AdamW foreach, no breakdown by category")


def _pipeline_scenario(scenario, result, card, layout, common: dict, started: float) -> None:
    """A scenario with pipeline stages: the larger of the first and the last pipeline rank's peaks
    (``simulate.pipeline.simulate_first_and_last``: torch's schedule, FSDP2 and tensor parallel inside the stages
    under fake mode, as ``flashckpt fit`` reads a pipeline candidate), and its saving against the same ranks without
    activation checkpointing."""
    from pytest_flashckpt.simulate.pipeline import simulate_first_and_last

    pipeline = scenario.layout.pipeline_schedule()

    def ranks_of(strategy: str) -> dict:
        return simulate_first_and_last(card, layout, pipeline, strategy=strategy, **common)

    record = record_rank(scenario, result, ranks_of, started, "fwd_bwd_start_bytes", "sdpa-flash-cpu (fake rank)")
    phase = "forward+backward" if record["fwd_bwd_peak_bytes"] >= record["optimizer_peak_bytes"] else "optimizer step"
    ranks = ", ".join(f"rank {r} {b:,} B" for r, b in record["ranks"].items())
    engine = ("torch's pipelining schedule + " + ("parallelize_module + " if layout.tp > 1 else "")
              + (f"torch's ring attention over {layout.cp} cp ranks + " if layout.cp > 1 else "") + "fully_shard")
    lines = []
    if record.get("microbatches_extrapolated"):
        lines.append(f"{', '.join(map(str, record['simulated_microbatches']))} microbatches simulated, the step's "
                     f"{pipeline.microbatches} read off their line")
    if record.get("extrapolated"):
        lines.append(f"depths {', '.join(map(str, record['simulated_depths']))} simulated, the card's {card.n_layer} "
                     "blocks read off their line")
    how = "; ".join(lines) or "simulated whole"
    result.notes.append(f"simulated by the real engine ({engine} under FakeTensorMode, {layout.describe()}, "
                        f"{pipeline.describe()}, {pipeline.stages_per_rank} "
                        f"stage(s) per rank; the first and last pipeline ranks: {ranks}; {how}): peak in the {phase} "
                        "of the larger; CPU flash-attention op, no breakdown by category")
