"""``flashckpt fit``: which layouts of a model fit a device at a global batch, ranked by a step-time model.

    flashckpt fit --model llama3-70b --seq 8192 --global-batch-tokens 1048576 --gpus 8,16,64 --device-memory 80GiB
    flashckpt fit --model torchtitan/llama3_70b.toml --gpus 64 --write-torchtitan chosen.toml --write-scenario chosen.yaml

Exit status 0 with a table of the fitting layouts per GPU count; 2 for bad input or when no layout fits at any GPU
count (the message names the closest and by how much). The parser is built without torch (the search imports it).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from pytest_flashckpt.config.errors import InputError
from pytest_flashckpt.core.registry import PRECISIONS
from pytest_flashckpt.fit.assumptions import DEFAULT_MARGIN, DEFAULT_MFU, DEFAULT_STORAGE_GBPS
from pytest_flashckpt.fit.candidates import DEFAULT_SCHEDULES, PIPELINE_SCHEDULES, STRATEGIES
from pytest_flashckpt.fit.checkpoint_cost import LLAMA3_GPU_HOURS_PER_INTERRUPTION
from pytest_flashckpt.fit.hardware import DEFAULT_DEVICE, DEVICES, OVERRIDES, choose_device, load_hardware_file
from pytest_flashckpt.simulate.devices import gib, parse_device_memory


def _int_list(option: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise InputError(f"{option} {text!r}: expected comma-separated positive integers, e.g. 8,16,64") from None
    if not values or any(v < 1 for v in values):
        raise InputError(f"{option} {text!r}: expected comma-separated positive integers, e.g. 8,16,64")
    return values


def add_parser(sub) -> None:
    p = sub.add_parser(
        "fit", help="which layouts fit? dp_shard x tp x microbatch x strategy, simulated per rank and ranked by time",
        description="Enumerate the layouts of a model on each GPU count (FSDP / HSDP x tensor parallel x microbatch and "
        "gradient accumulation x reshard_after_forward x activation strategy x precision), prune them by their exact "
        "state bytes, rank them by a step-time model of the device and its links, simulate the per-rank peak of the "
        "fastest with the real engine under fake mode until enough fit, and print them with their checkpoint cost. "
        "Pipeline stages (pp x schedule x microbatches) are searched with FSDP; context parallel is not searched yet. Exit status 0: a table; 2: bad input or nothing fits.")
    p.add_argument("--model", required=True, help="a model card name or path, a Hugging Face config.json (model_type "
                   "llama), or a torchtitan TOML ([model] name/flavor; its seq_len, batch and degrees are defaults)")
    p.add_argument("--seq", type=int, help="sequence length (default: the TOML's seq_len, else 8192)")
    p.add_argument("--global-batch-tokens", type=int, help="tokens per optimizer step (default: the TOML's global batch "
                   "x seq_len, else 1048576)")
    p.add_argument("--gpus", help="comma-separated GPU counts to search, e.g. 8,16,64 (default: the TOML's degrees, else 8)")
    p.add_argument("--device", default=DEFAULT_DEVICE, help=f"GPU of the time model: {', '.join(DEVICES)} (default {DEFAULT_DEVICE})")
    p.add_argument("--hardware", metavar="FILE", help="YAML overriding or adding devices: {name: {field: value}} (fit.hardware)")
    for option, (field, unit) in OVERRIDES.items():
        p.add_argument("--" + option.replace("_", "-"), type=float, dest=option,
                       help=f"override the device's {field} ({'per GPU, per direction, ' if 'link' in field or 'network' in field else ''}"
                            f"in {'TFLOP/s' if unit == 1e12 else 'GB/s' if unit == 1e9 else 'GPUs'})")
    p.add_argument("--device-memory", metavar="SIZE", help="memory per GPU, e.g. 80GiB (default: the device's)")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN, help="fraction of device memory kept free for what the "
                   "simulation does not count (CUDA context, NCCL/cuBLAS workspaces, allocator fragmentation); an "
                   f"assumption, not yet measured on a GPU (default {DEFAULT_MARGIN})")
    p.add_argument("--precision", default="mixed", choices=(*PRECISIONS, "both"),
                   help="pure bf16, mixed (bf16 compute, float32 master weights and AdamW state, FSDP2's "
                        "MixedPrecisionPolicy), or both (default mixed)")
    p.add_argument("--strategies", help=f"activation strategies to search, comma-separated (default: a torchtitan TOML's "
                   f"[activation_checkpoint] mode, else {','.join(STRATEGIES)})")
    p.add_argument("--k", type=int, default=2, help="every_k: checkpoint blocks 0, k, 2k, ... (default 2)")
    p.add_argument("--tp", help="tensor-parallel degrees to search, comma-separated (default: a torchtitan TOML's "
                   "tensor_parallel_degree, else every divisor of a node that divides the heads)")
    p.add_argument("--pp", help="pipeline degrees to search, comma-separated (default: a torchtitan TOML's "
                   "pipeline_parallel_degree, else 1,2,4,8,16 where they divide the GPUs and the blocks); 1 alone: no "
                   "pipeline")
    p.add_argument("--schedules", help=f"pipeline schedules to search: {', '.join(PIPELINE_SCHEDULES)} (default: a "
                   f"torchtitan TOML's pipeline_parallel_schedule, else {','.join(DEFAULT_SCHEDULES)}; interleaved_1f1b "
                   "holds 2 stages per rank)")
    p.add_argument("--cp", help="context-parallel degrees to search, comma-separated (default: a torchtitan TOML's "
                   "context_parallel_degree, else 2,4,8 from 32768 tokens on); composed with FSDP (over dp_shard x "
                   "cp) and tp, torch's ring attention simulated on the fake process group")
    p.add_argument("--max-microbatch", type=int, default=16, help="largest microbatch per data-parallel rank (default 16)")
    p.add_argument("--no-hsdp", action="store_true", help="do not search HSDP replicas (dp_replicate)")
    p.add_argument("--mfu", type=float, default=DEFAULT_MFU, help="fraction of the device's bf16 peak the step's matmuls "
                   f"reach, recomputation included (default {DEFAULT_MFU}: torchtitan's Llama 3 FSDP runs report 50-58%% MFU)")
    p.add_argument("--storage-gbps", type=float, default=DEFAULT_STORAGE_GBPS,
                   help=f"checkpoint write bandwidth per node in GB/s (default {DEFAULT_STORAGE_GBPS}, an assumption)")
    p.add_argument("--mtbf-hours", type=float, help="the job's mean time between failures (default: Llama 3's rate, one "
                   f"interruption per {LLAMA3_GPU_HOURS_PER_INTERRUPTION:,.0f} GPU-hours, over the GPU count)")
    p.add_argument("--top", type=int, default=5, help="fitting layouts to find per GPU count (default 5)")
    p.add_argument("--max-simulations", type=int, default=12, help="distinct rank simulations per GPU count (default 12)")
    p.add_argument("--write-scenario", metavar="F.yaml", help="write the chosen layout as a suite scenario")
    p.add_argument("--write-torchtitan", metavar="F.toml", help="write the chosen layout as a torchtitan config")
    p.set_defaults(run=run)


def _checked_options(args: argparse.Namespace) -> None:
    positive = {"--seq": args.seq, "--global-batch-tokens": args.global_batch_tokens, "--k": args.k,
                "--max-microbatch": args.max_microbatch, "--top": args.top, "--max-simulations": args.max_simulations,
                "--storage-gbps": args.storage_gbps, "--mtbf-hours": args.mtbf_hours}
    for option, value in positive.items():
        if value is not None and value <= 0:
            raise InputError(f"{option} {value}: must be more than zero")
    if not 0 <= args.margin < 1:
        raise InputError(f"--margin {args.margin}: a fraction of device memory in [0, 1), e.g. 0.1")
    if not 0 < args.mfu <= 1:
        raise InputError(f"--mfu {args.mfu}: a fraction of the peak in (0, 1], e.g. 0.5")
    if args.strategies is not None:
        strategies = tuple(s.strip() for s in args.strategies.split(",") if s.strip())
        if not strategies or any(s not in STRATEGIES for s in strategies):
            raise InputError(f"--strategies {args.strategies!r}: fit searches {', '.join(STRATEGIES)}, the strategies "
                             "whose registry row (core.registry) sets fit_order: each candidate's rank is simulated on "
                             "fake ranks and timed by closed-form FLOPs (the budget planner has neither, it is planned "
                             "per input: run flashckpt simulate --budget on the chosen layout)")
        args.strategies = strategies
    for path, suffix, option in ((args.write_scenario, (".yaml", ".yml"), "--write-scenario"), (args.write_torchtitan, (".toml",), "--write-torchtitan")):
        if path is None:
            continue
        target = Path(path)
        if target.suffix not in suffix or target.is_dir() or not target.parent.is_dir():
            raise InputError(f"{option} {path}: name a {suffix[0]} file in an existing folder")


def request_from(args: argparse.Namespace):
    """The search request of the parsed options (the model read, the device chosen), before anything simulates."""
    from pytest_flashckpt.fit.model_input import read_model
    from pytest_flashckpt.fit.search import FitRequest

    _checked_options(args)
    model = read_model(args.model)
    table = load_hardware_file(args.hardware) if args.hardware else None
    device = choose_device(args.device, table, **{option: getattr(args, option) for option in OVERRIDES})
    settings = model.settings
    seq = args.seq or settings.get("seq_len", 8192)
    tokens = args.global_batch_tokens or settings.get("global_batch_tokens", 1048576)
    gpus = _int_list("--gpus", args.gpus) if args.gpus else (settings["gpus"],) if "gpus" in settings else (8,)
    tp = _int_list("--tp", args.tp) if args.tp else (settings["tp"],) if "tp" in settings else None
    schedules = DEFAULT_SCHEDULES if "schedule" not in settings else (settings["schedule"],)
    if args.schedules is not None:
        schedules = tuple(part.strip() for part in args.schedules.split(",") if part.strip())
        unknown = [name for name in schedules if name not in PIPELINE_SCHEDULES]
        if not schedules or unknown:
            raise InputError(f"--schedules {args.schedules!r}: fit simulates the pipeline schedules "
                             f"{', '.join(PIPELINE_SCHEDULES)}; choose among them")
    pp_requested = _int_list("--pp", args.pp) if args.pp else (settings["pp"],) if "pp" in settings else None
    cp_requested = _int_list("--cp", args.cp) if args.cp else (settings["cp"],) if "cp" in settings else None
    strategies = args.strategies or ((settings["strategy"],) if "strategy" in settings else STRATEGIES)
    k = settings.get("k", args.k) if args.strategies is None else args.k
    try:
        memory = parse_device_memory(args.device_memory) if args.device_memory else device.memory_bytes
    except ValueError as exc:
        raise InputError(f"--device-memory {args.device_memory}: {exc}") from None
    precisions = ("pure", "mixed") if args.precision == "both" else (args.precision,)
    block = getattr(model.card, "block_size", None)
    if block is not None and seq > block:
        raise InputError(f"--seq {seq}: longer than model card {model.card.name!r}'s block_size {block}; use a shorter "
                         "sequence or a card with a longer context")
    from pytest_flashckpt.fit.candidates import cp_degrees, pp_degrees

    pp = tuple(sorted({d for g in gpus for d in pp_degrees(model.card, g, pp_requested, schedules)})) or (1,)
    cp = tuple(sorted({d for g in gpus for d in cp_degrees(model.card, g, seq, cp_requested)}))
    return model, FitRequest(model.card, seq, tokens, gpus, device, memory, strategies=strategies, pp=pp, cp=cp,
                             schedules=schedules,
                             precisions=precisions, tp=tp, max_microbatch=args.max_microbatch, hsdp=not args.no_hsdp,
                             k=k, margin=args.margin, mfu=args.mfu, storage_gbps=args.storage_gbps,
                             mtbf_hours=args.mtbf_hours, top=args.top, max_simulations=args.max_simulations)


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


TABLE_HEADER = ("| # | GPUs | layout | microbatch x accum | strategy | precision | reshard | per-rank peak | step (compute / TP, "
                "PP, CP comms / FSDP exposed) | tokens/s/GPU | MFU | ckpt per rank | staging per node | save | save every |")


def row(i: int, r, usable: int) -> str:
    c, t, m, k = r.candidate, r.time, r.memory, r.checkpoint
    peak = "—" if m is None else f"{gib(m.peak_bytes)}, headroom {gib(usable - m.peak_bytes)} ({m.source})"
    return (f"| {i} | {c.gpus} | {c.describe()} | {c.microbatch} x {c.accumulation} | {c.describe_strategy()} | {c.precision} "
            f"| {'yes' if c.reshard_after_forward else 'no'} | {peak} | {_duration(t.step_s)} ({_duration(t.compute_s)} / "
            f"{_duration(t.tp_s)} / {_duration(t.fsdp_exposed_s)}) | {t.tokens_per_s_per_gpu:,.0f} | {t.mfu:.1%} | {gib(k.bytes_per_rank)} | "
            f"{gib(k.staging_bytes_per_node)} | {_duration(k.save_s)} | {_duration(k.interval_s)} |")


def describe(request, model, results) -> list[str]:
    d = request.device
    schedules = f" ({', '.join(request.schedules)})" if max(request.pp) > 1 else ""
    lines = [
        f"{model.source}: seq {request.seq_len}, {request.global_batch_tokens:,} tokens per step, {d.name} "
        f"({d.peak_flops / 1e12:,.1f} TFLOP/s bf16 x mfu {request.mfu}, NVLink {d.nvlink_bytes_per_s / 1e9:.0f} GB/s, "
        f"network {d.network_bytes_per_s / 1e9:.0f} GB/s per GPU, {d.gpus_per_node} GPUs per node)",
        f"usable memory per GPU: {gib(request.usable_bytes)} = {gib(request.device_memory)} less a margin of "
        f"{request.margin:.0%} for the CUDA context, NCCL/cuBLAS workspaces and allocator fragmentation (assumed: the "
        "GPU margin is not measured yet)",
        f"searched: FSDP / HSDP x tp x pp {','.join(map(str, request.pp))}"
        f"{schedules} x "
        f"microbatch x reshard_after_forward x strategy x precision; cp {','.join(map(str, request.cp)) or 'none'} "
        "(with FSDP over dp_shard x cp, tp and inside pipeline stages); a pipeline's peak is the larger of its "
        "first and last rank's",
        "", TABLE_HEADER, "|" + "---|" * (TABLE_HEADER.count("|") - 1),
    ]
    i = 0
    for found in results:
        for r in found.fitting:
            i += 1
            lines.append(row(i, r, request.usable_bytes))
    lines.append("")
    for found in results:
        line = (f"{found.gpus} GPUs: {found.enumerated} layouts, {found.pruned_by_state} ruled out by their state bytes, "
                f"{found.pruned_by_dominance} by a simulated one holding no more, {found.simulations} simulated, {len(found.fitting)} fit")
        if not found.fitting and found.untried:  # the budget ran out: layouts that may fit were never simulated
            line += (f"; none of those simulated fits, {found.untried} layouts left unsimulated (raise "
                     f"--max-simulations): {closest_text(found, request.usable_bytes)}")
        elif not found.fitting:
            line += f"; none fits: {closest_text(found, request.usable_bytes)}"
        lines.append(line)
    return lines


def closest_text(found, usable: int) -> str:
    closest = found.closest()
    if closest is not None:
        c = closest.candidate
        return (f"closest {c.describe()} microbatch {c.microbatch} {c.describe_strategy()} {c.precision} at "
                f"{gib(closest.memory.peak_bytes)} per rank, short by {gib(closest.memory.peak_bytes - usable)}")
    if found.closest_state is not None:
        c, nbytes = found.closest_state
        return (f"even the training state alone exceeds the usable memory: closest {c.describe()} {c.precision} holds "
                f"at least {gib(nbytes)} per rank, short by {gib(nbytes - usable)}")
    refused = [r.refused for r in found.not_fitting if r.refused]
    if refused:
        return f"the engine refused the layouts tried ({refused[0]})"
    return "no simulation within --max-simulations; raise it"


def run(args: argparse.Namespace) -> int:
    from pytest_flashckpt.fit.search import search
    from pytest_flashckpt.fit.writers import torchtitan_toml, write_scenario, write_torchtitan

    model, request = request_from(args)
    try:
        results = search(request, progress=lambda line: print(f"  ... {line}", flush=True))
    except ValueError as exc:  # a workload the simulation refuses before it runs (e.g. a card the family rejects)
        raise InputError(f"--model {args.model}: {exc}") from None
    fitting = [r for found in results for r in found.fitting]
    if not fitting:
        untried = sum(found.untried for found in results)
        raise InputError(("no layout simulated fits" if untried else "no layout fits") + " " + "; ".join(
            f"{found.gpus} GPUs: {closest_text(found, request.usable_bytes)}" for found in results)
            + (f" ({untried} layouts left unsimulated: raise --max-simulations)" if untried else ""))
    print("\n".join(describe(request, model, results)))
    chosen = max(fitting, key=lambda r: (r.time.tokens_per_s_per_gpu, -r.candidate.gpus))
    c = chosen.candidate
    summary = (f"{model.card.name} {c.describe()} on {c.gpus} {request.device.name}, microbatch {c.microbatch} x "
               f"accumulation {c.accumulation}, {c.describe_strategy()}, {c.precision}")
    print(f"chosen (most tokens/s per GPU): {summary}")
    if args.write_scenario:
        written = write_scenario(Path(args.write_scenario), model.card.name, c, request.seq_len, summary)
        print(f"scenario: {written.path}")
    if args.write_torchtitan:
        interval_steps = max(1, math.floor(chosen.checkpoint.interval_s / chosen.time.step_s))
        path = write_torchtitan(Path(args.write_torchtitan), torchtitan_toml(model.card.name, c, request.seq_len, summary, interval_steps))
        print(f"torchtitan config: {path}")
    return 0
