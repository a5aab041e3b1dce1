"""``flashckpt simulate ... --pp P`` and ``... --cp C``: a pipeline stage's or a context-parallel rank's peak, for
the command line.

    flashckpt simulate --model llama3-8b --seq 4096 --batch 8 --strategy full --world-size 4 --pp 4 --microbatches 8
    flashckpt simulate --model llama3-8b --seq 131072 --batch 1 --strategy full --world-size 8 --cp 8

``--pp``: rank 0 (the first stage, which holds the most in-flight microbatches) of a ``pp x dp_shard x tp`` layout
(``--tp``: tensor parallel inside the stages, ``distributed.pipeline``), run by torch's
``torch.distributed.pipelining`` schedule under fake mode (``simulate.pipeline``; a deep card's stage read off
the line through fewer blocks per stage). ``--cp``: one rank of ``cp`` ranks sharing the sequence. Composed with
FSDP (``--world-size`` above ``cp x tp``: FSDP2 over ``dp_shard x cp``), with ``--tp`` or in mixed precision, it
is the rank of the real engine under fake mode (``simulate.fake_ranks``: torch's ring attention with the CPU flash
op on the fake process group, equal to the byte to gloo ranks, reports/spike-cp-ranks.md); alone in pure precision,
the meta step at ``seq / cp`` tokens with torch's ring and the CUDA flash op (``simulate.context_parallel``),
labelled "modelled" until the GPU suite measures it. Both: the stages' blocks run the ring over the cp ranks of
their pipeline rank (reports/spike-cp-stages.md). Every input is checked before anything is built
(``config.layout``); an error is one line naming the option and the fix.
"""

from __future__ import annotations

import argparse

from pytest_flashckpt.config.errors import InputError
from pytest_flashckpt.config.layout import Layout, PipelineSchedule, context_composed
from pytest_flashckpt.simulate.devices import REPORT_DEVICES, gib, parse_device_memory, verdict
from pytest_flashckpt.simulate.layouts import LAYOUT_STRATEGIES, engine_cannot_run
from pytest_flashckpt.simulate.workload import dtype_name


def _where(args: argparse.Namespace) -> str:
    axes = [f"--world-size {args.world_size}"] + [f"--{a} {getattr(args, a)}" for a in ("tp", "pp", "cp") if getattr(args, a) != 1]
    return " ".join(axes)


def check_args(args: argparse.Namespace):
    """The card, layout and dtype the options ask for, or an ``InputError`` naming the option (nothing is built)."""
    from pytest_flashckpt.models.cards import load_card

    refusal = engine_cannot_run(args)
    if refusal is not None:
        raise InputError(f"{_where(args)}: {refusal}")
    try:
        layout = Layout.for_world(args.world_size, tp=args.tp, pp=args.pp, cp=args.cp)
        layout.check_sequence(args.seq)
        card = load_card(args.model)
        layout.check_card(card)
        layout.check_stages(card.n_layer, args.stages_per_rank)
        layout.check_stage_shards(args.seq, card.vocab_size)
        layout.check_batch(args.batch)
        dtype = dtype_name(args.dtype)
    except FileNotFoundError as exc:
        raise InputError(f"--model {args.model}: {exc}") from None
    except ValueError as exc:
        raise InputError(f"{_where(args)}: {exc}") from None
    if args.precision == "mixed" and dtype != "bfloat16":
        raise InputError(f"--precision mixed computes in bf16 over fp32 master weights; --dtype {args.dtype} has no mixed form")
    if args.seq > card.block_size:
        raise InputError(f"--seq {args.seq} exceeds block_size {card.block_size} of model card {card.name!r}; use a shorter --seq")
    return card, layout, dtype


def _record(args: argparse.Namespace, card, layout: Layout, dtype: str) -> tuple[dict, str]:
    import torch

    if layout.pp != 1:
        from pytest_flashckpt.simulate.pipeline import side_by_side_jobs, simulate_first_and_last

        schedule = PipelineSchedule(args.schedule, args.microbatches, args.stages_per_rank)
        schedule.check(layout, batch_size=args.batch, n_blocks=card.n_layer)
        # the first stage holds the most in-flight microbatches, the last the head and the loss: either can peak
        record = simulate_first_and_last(card, layout, schedule, batch_size=args.batch, seq_len=args.seq,
                                         strategy=args.strategy, k=args.k, dtype=getattr(torch, dtype),
                                         precision=args.precision, jobs=side_by_side_jobs())
        depths = record.get("simulated_depths", [])
        how = (f"; depths {', '.join(map(str, depths))} simulated, the card's {card.n_layer} blocks read off their line"
               if record.get("extrapolated") else "")
        if record.get("microbatches_extrapolated"):
            counts = record["simulated_microbatches"]
            how += (f"; {', '.join(map(str, counts))} microbatches simulated, the step's {args.microbatches} read off "
                    "their line")
        tensor_parallel = f", tensor parallel over {layout.tp} ranks inside it" if layout.tp > 1 else ""
        tensor_parallel += f", context parallel over {layout.cp} ranks inside it" if layout.cp > 1 else ""
        ranks = " and ".join(f"rank {r}: {gib(b)}" for r, b in record["ranks"].items())
        stage = "the first stage" if record["rank"] == 0 else "the last stage"
        what = (f"{stage} of {layout.pp} ({args.schedule}, {args.microbatches} microbatches{tensor_parallel}; the "
                f"larger of the first and the last pipeline rank, {ranks}), simulated "
                f"by torch's pipelining schedule + {'parallelize_module + ' if layout.tp > 1 else ''}"
                f"{'ring attention + ' if layout.cp > 1 else ''}fully_shard under "
                f"FakeTensorMode{how}")
        return record, what
    from pytest_flashckpt.simulate.context_parallel import simulate_cp_rank

    if context_composed(layout, args.precision):
        return _composed_context_record(args, card, layout, dtype)

    record = simulate_cp_rank(card, layout, batch_size=args.batch, seq_len=args.seq, dtype=dtype, strategy=args.strategy, k=args.k)
    what = (f"one of {layout.cp} ranks at {record['seq_per_rank']} tokens with torch's ring attention "
            f"(modelled: ring adds {gib(record['ring_extra_bytes'])} over local attention)")
    return record, what


def _composed_context_record(args: argparse.Namespace, card, layout: Layout, dtype: str) -> tuple[dict, str]:
    import torch

    from pytest_flashckpt.simulate.fake_ranks import simulate_rank
    from pytest_flashckpt.simulate.layouts import CUDA_ADAMW_FOREACH

    record = simulate_rank(card, layout, batch_size=args.batch, seq_len=args.seq, strategy=args.strategy,
                           dtype=getattr(torch, dtype), precision=args.precision, k=args.k, foreach=CUDA_ADAMW_FOREACH)
    depths = record.get("simulated_depths", [])
    how = (f"; depths {', '.join(map(str, depths))} simulated, the card's {card.n_layer} blocks read off their line"
           if record.get("extrapolated") else "")
    tensor_parallel = f", tensor parallel over {layout.tp}" if layout.tp > 1 else ""
    what = (f"one of {layout.cp} context-parallel ranks at {args.seq // layout.cp} tokens (FSDP2 over dp_shard x cp = "
            f"{layout.dp_shard * layout.cp} ranks{tensor_parallel}), simulated by torch's ring attention (CPU flash op) "
            f"+ {'parallelize_module + ' if layout.tp > 1 else ''}fully_shard under FakeTensorMode{how}")
    return record, what


def run_stage_layout(args: argparse.Namespace) -> int:
    card, layout, dtype = check_args(args)
    if args.strategy not in LAYOUT_STRATEGIES:
        raise InputError(f"--strategy {args.strategy}: use one of {', '.join(LAYOUT_STRATEGIES)} with --pp or --cp")
    device_bytes = None if args.device_memory is None else parse_device_memory(args.device_memory)
    try:
        record, what = _record(args, card, layout, dtype)
    except ValueError as exc:
        raise InputError(f"{_where(args)}: {exc}") from None
    peak = record["peak_bytes"]
    print(f"{card.name}, {dtype} {args.precision}, batch {args.batch} x seq {args.seq}, strategy {args.strategy}, "
          f"layout {layout.describe()} ({layout.world_size} ranks)")
    print(f"per-rank peak: {gib(peak)} ({peak} bytes), {what}")
    if device_bytes is None:
        for label, size in REPORT_DEVICES:
            print(f"  on {label}: {verdict(peak, size)}")
        return 0
    print(f"device memory {args.device_memory} ({gib(device_bytes)}): {verdict(peak, device_bytes)}")
    return 0 if peak <= device_bytes else 1
