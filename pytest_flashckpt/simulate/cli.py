"""``flashckpt simulate``: predicted peak of one training step, its breakdown, and whether it fits a device.

    flashckpt simulate --model gpt3-2.7b --seq 2048 --batch 8 --dtype bf16 --strategy full --device-memory 80GiB
    flashckpt simulate --model gpt3-2.7b --budget "40 GiB"   # plan the budget strategy, simulate the planned step

Exit status: 0 when it fits (or no --device-memory was given), 1 when it does not fit, 2 on bad input.
"""

from __future__ import annotations

import argparse

from pytest_flashckpt.config.errors import InputError
from pytest_flashckpt.config.model_card import card_schemas
from pytest_flashckpt.core.registry import ACTIVATION_STRATEGIES, PRECISIONS
from pytest_flashckpt.core.registry import describe as describe_choices
from pytest_flashckpt.simulate.devices import REPORT_DEVICES, gib, parse_device_memory, verdict


def add_parser(sub) -> None:
    """The choices are the registry's (every strategy; one that the simulation cannot run is refused by ``run`` with
    the reason) and the model families' (by their card schemas, ``config.model_card``: no torch import to build
    the parser)."""
    from pytest_flashckpt.config.step_impl import LOSSES, NORMS, OPTIMIZERS
    from pytest_flashckpt.simulate.kernels import KERNELS

    p = sub.add_parser(
        "simulate",
        help="will it fit? the exact peak of a training step, simulated on the meta device",
        description="Run the real training step (forward, backward, AdamW step) of a model card on tensors that "
        "allocate nothing and print its exact peak memory, the breakdown, and whether it fits the device. "
        "Exit status 0: fits (or no --device-memory), 1: does not fit, 2: bad input.",
    )
    p.add_argument("--model", default="gpt3-2.7b",
                   help=f"model card name or path, of a family: {', '.join(card_schemas())} (default gpt3-2.7b)")
    p.add_argument("--hf-config", metavar="CONFIG_JSON", help="a Hugging Face config.json to simulate instead of --model "
                   "(built on meta by the builder measured runs use; needs pytest-flashckpt[hf])")
    p.add_argument("--seq", type=int, default=2048, help="sequence length (default 2048)")
    p.add_argument("--batch", type=int, default=8, help="global batch size (default 8)")
    p.add_argument("--dtype", default="bf16", help="bf16, fp16 or fp32 (default bf16)")
    p.add_argument("--precision", default="pure", choices=tuple(PRECISIONS),
                   help=f"{describe_choices(PRECISIONS)} (default pure)".replace("%", "%%"))
    p.add_argument("--strategy", default="none", choices=tuple(ACTIVATION_STRATEGIES),
                   help=f"activation checkpointing: {describe_choices(ACTIVATION_STRATEGIES)} (default none)".replace("%", "%%"))
    p.add_argument("--budget", metavar="BUDGET", help="plan strategy budget to fit BUDGET ('40 GiB', 0.6, 'min + 30%%'); implies --strategy budget")
    p.add_argument("--k", type=int, default=2, help="every_k: checkpoint blocks 0, k, 2k, ... (default 2)")
    p.add_argument("--kernel", default="flash", choices=KERNELS, help="attention kernel (default flash)")
    p.add_argument("--target", default="cuda", choices=("cuda", "cpu"), help="device the prediction is for (default cuda)")
    p.add_argument("--world-size", type=int, default=1, help="ranks: rank 0's peak, simulated by the real engine (fully_shard, parallelize_module) under fake mode (default 1)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks of --world-size (FSDP over the rest; simulate.layouts; with --pp inside each stage) (default 1)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages of --world-size (FSDP over the rest): the larger of the first and the last stage's peak from torch's pipelining schedule under fake mode, simulate.stage_layouts (default 1)")
    p.add_argument("--schedule", default="1f1b", choices=("gpipe", "1f1b", "interleaved_1f1b"), help="--pp: the pipeline schedule (default 1f1b)")
    p.add_argument("--microbatches", type=int, default=1, help="--pp: microbatches per step of a data-parallel rank (default 1)")
    p.add_argument("--stages-per-rank", type=int, default=1, help="--pp with interleaved_1f1b: stages each rank holds (default 1)")
    p.add_argument("--cp", type=int, default=1, help="context-parallel ranks sharing the sequence: one rank with torch's ring attention; with FSDP (--world-size above cp x tp, FSDP2 over dp_shard x cp), --tp or mixed precision the fake-rank engine's, alone the CUDA-op ring on meta, modelled (default 1)")
    p.add_argument("--device-memory", metavar="SIZE", help="device memory, e.g. 80GiB or '40 GB'")
    p.add_argument("--norm", choices=tuple(NORMS), help="RMSNorm: plain (Hugging Face) or fused (nn.RMSNorm, torchtitan); llama cards (default: the card's)")
    p.add_argument("--optimizer", default="adamw", choices=tuple(OPTIMIZERS), help="optimizer implementation (default adamw: foreach on CUDA)")
    p.add_argument("--loss", default="plain", choices=tuple(LOSSES), help="plain: all logits at once; chunked: head + loss over checkpointed sequence chunks (default plain)")
    p.add_argument("--loss-chunks", type=int, default=8, help="--loss chunked: sequence chunks (default 8)")
    p.set_defaults(run=run)


def chosen_strategy(args: argparse.Namespace) -> str:
    """The strategy to simulate: ``--strategy``, or the budget strategy with ``--budget``; an ``InputError`` with the
    reason for one the simulation cannot run (``ActivationStrategySpec.not_simulated``) or one missing its budget."""
    budgeted = next(name for name, spec in ACTIVATION_STRATEGIES.items() if spec.takes_budget)
    strategy = args.strategy
    if args.budget is not None:
        if strategy not in ("none", budgeted):
            raise InputError(f"--budget plans the {budgeted} strategy; it cannot be combined with --strategy {strategy}")
        return budgeted
    spec = ACTIVATION_STRATEGIES[strategy]
    if spec.not_simulated:
        raise InputError(f"--strategy {strategy}: {spec.not_simulated}")
    if spec.takes_budget:
        raise InputError(f"--strategy {strategy} needs --budget, e.g. --budget '40 GiB', --budget 0.6 or --budget 'min + 30%'")
    return strategy


def run(args: argparse.Namespace) -> int:
    modelled = None
    if args.pp != 1 or args.cp != 1:  # a pipeline stage or a context-parallel rank (heavy imports, so here)
        from pytest_flashckpt.simulate.stage_layouts import run_stage_layout

        return run_stage_layout(args)
    if args.tp != 1 or args.world_size > 1:  # a layout: the real engine under fake mode (heavy imports, so here)
        from pytest_flashckpt.simulate.layouts import engine_cannot_run, run_layout

        modelled = engine_cannot_run(args)
        if modelled is None or args.tp != 1:  # (run_layout refuses what the engine cannot run under tp)
            return run_layout(args)
    strategy = chosen_strategy(args)
    if args.budget is not None:  # read as a suite reads it (a fraction, 'min', 'min + N%', a size), before anything runs
        from pytest_flashckpt.config.budget import BudgetSpec

        try:
            BudgetSpec.parse(args.budget)
        except ValueError as exc:
            raise InputError(str(exc).replace("activation.budget", "--budget")) from None
    try:
        device_bytes = None if args.device_memory is None else parse_device_memory(args.device_memory)
        from pytest_flashckpt.config.step_impl import StepImpl
        from pytest_flashckpt.simulate import simulate_step
        from pytest_flashckpt.simulate.workload import simulation_card

        impl = StepImpl(args.norm, args.optimizer, args.loss, args.loss_chunks)
        peak = simulate_step(
            simulation_card(args.model, args.hf_config), args.dtype, args.batch, args.seq, args.kernel, strategy, k=args.k,
            target=args.target, world_size=args.world_size, budget=args.budget, precision=args.precision, impl=impl,
        )
    except (ValueError, FileNotFoundError) as exc:
        raise InputError(str(exc).replace("activation.budget", "--budget").replace("step_impl.loss_chunks", "--loss-chunks").replace("step_impl.norm", "--norm")) from None
    print("\n".join(describe(peak)))
    if modelled is not None:
        print(f"  FSDP modelled, not run by the engine: {modelled}")
    if impl != StepImpl():
        print(f"step: {impl.describe()}")
    if device_bytes is None:
        for label, size in REPORT_DEVICES:
            print(f"  on {label}: {verdict(peak.peak_bytes, size)}")
        return 0
    print(f"device memory {args.device_memory} ({gib(device_bytes)}): {verdict(peak.peak_bytes, device_bytes)}")
    return 0 if peak.fits(device_bytes) else 1


def describe(peak) -> list[str]:
    from pytest_flashckpt.config.scenario import precision_label

    ranks = f", per rank of {peak.world_size} (FSDP, batch {peak.batch_size // peak.world_size} per rank)" if peak.world_size > 1 else ""
    lines = [
        f"{peak.card}, {precision_label(peak.dtype, peak.precision)}, batch {peak.batch_size} x seq {peak.seq_len}, attention {peak.kernel} ({peak.target}), "
        f"strategy {peak.strategy}{ranks}",
        f"predicted peak: {gib(peak.peak_bytes)} ({peak.peak_bytes} bytes) at {peak.peak_op} in the {peak.peak_phase} "
        f"(simulated on meta in {peak.seconds:.1f} s)",
    ]
    for category, nbytes in peak.breakdown.items():
        lines.append(f"  {category:<16} {gib(nbytes):>12}")
    if peak.sharding:
        from pytest_flashckpt.simulate.fsdp import gathered_in

        gathered = gib(peak.sharding["all_gathered_bytes"])
        if gathered_in(peak.peak_phase, peak.sharding["all_gathered_bytes"]):
            lines.append(f"  (FSDP: includes {gathered} of all-gathered unsharded parameters, modelled)")
        else:
            lines.append(f"  (FSDP: the {peak.peak_phase} step runs on shards: none of the {gathered} all-gathered in forward and backward)")
    if peak.plan:
        lines.append(f"budget plan ({peak.plan['plan_s']:.1f} s to plan): {peak.plan['describe']}")
        lines += [f"  option {name} left out: {why}" for name, why in peak.plan["excluded"].items()]
        lines += [f"  {note}" for note in peak.plan["notes"]]
    lines.append("  not counted: CUDA context, cuBLAS/NCCL workspaces, allocator rounding and fragmentation")
    return lines
