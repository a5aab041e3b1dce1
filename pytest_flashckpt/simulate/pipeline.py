"""One pipeline rank simulated by the real engine: the stage split, tensor parallel inside the stage when the layout
has ``tp`` > 1, and torch's schedule (``distributed.pipeline``, the code the gloo ranks run) in one process under ``FakeTensorMode`` with torch's fake process group, as
``simulate.fake_ranks`` does for tensor parallel and FSDP (its mesh and collective helpers are reused).

So the in-flight activations are the schedule's own: under 1F1B the first stage runs ``pp`` microbatch forwards
before its first backward and holds their activations, under GPipe every microbatch's, under interleaved 1F1B
what torch's interleaved order keeps; the receive buffers torch's ``PipelineStage`` keeps (one activation
buffer per microbatch on a stage that is not first, one gradient buffer on a stage that is not last) count from
the window's start.

Two things differ from a gloo rank, and each is made to match it:

- torch's schedule opens with a vote among the stages (static or dynamic metadata) whose answer is read with
  ``.item()``, which fake mode cannot give (and fake peers send nothing). Every stage is built with its metadata
  (``StageShapes``), so on gloo the vote is unanimous: static. The simulated rank takes that answer
  (``_static_warmup``) instead of voting.
- A gloo ``Work`` holds the tensors it sends until the schedule drops it (a forward's output sent on, a
  backward's input gradient sent back), a fake one holds nothing: without ``_works_hold_their_tensors`` the
  fake rank's forward+backward peak was under the gloo rank's by 1 to 7 microbatch activations (8,192 to
  57,344 B on the 4-block card of tests/distributed/test_pipeline.py). With it every window's start and peak
  equal the gloo rank's to the byte for GPipe, 1F1B and interleaved 1F1B, and the gloo rank's CPU allocator
  equals its probe (point-to-point sends are not staged as gloo's collectives are).

The rest of the schedule (sends, receives, forwards, backwards, the gradient scaling) runs as on a real rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Callable

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.pipelining import schedules as _schedules
from torch.distributed.pipelining.stage import InferenceMode
from torch.testing._internal.distributed.fake_pg import FakeStore

from pytest_flashckpt.config.axes import CompileConfig
from pytest_flashckpt.config.layout import Layout, PipelineSchedule
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.distributed import context_parallel
from pytest_flashckpt.distributed import pipeline as pp
from pytest_flashckpt.distributed.fsdp import mixed_precision_policy
from pytest_flashckpt.distributed.memory import ShardedLiveTensorProbe
from pytest_flashckpt.simulate.fake_ranks import (
    _Compiled,
    _build_fake,
    _eager_collectives,
    _extrapolated,
    _real_meshes,
    WARMUPS,
    _sample_times,
    forget_meshes,
    warm_up,
)
from pytest_flashckpt.simulate.layer_extrapolation import MAX_SAMPLES, POINTS, line_through, sample_depths
from pytest_flashckpt.simulate.rank_probe import ResizeTrackingRankProbe


@contextlib.contextmanager
def _static_warmup(schedule):
    """While active, ``schedule``'s warm-up vote is skipped with the answer every stage would give: static."""

    def warmup(stages, has_backward, p2p_done) -> None:
        for stage in stages:
            stage._inference_mode = InferenceMode.STATIC

    schedule._warmup_p2p = warmup
    try:
        yield
    finally:
        del schedule._warmup_p2p


class _HeldWork:
    """A fake process group's ``Work`` that keeps its tensors alive for as long as it lives, as a gloo (or NCCL)
    ``Work`` does: the schedule keeps a send's work until it waits on it, and so the sent tensor too."""

    def __init__(self, work, tensors: list[torch.Tensor]) -> None:
        self.work, self.tensors = work, tensors

    def wait(self, *args, **kwargs):
        return self.work.wait(*args, **kwargs)


@contextlib.contextmanager
def _works_hold_their_tensors():
    """While active, the pipeline schedules' point-to-point works hold their tensors (``_HeldWork``)."""
    batch_p2p = _schedules._batch_p2p

    def held(p2p_ops, desc=None):
        works = batch_p2p(p2p_ops, desc)
        tensors = [op.tensor for op in p2p_ops]
        return [_HeldWork(work, tensors) for work in works]

    _schedules._batch_p2p = held
    try:
        yield
    finally:
        _schedules._batch_p2p = batch_p2p


STAGE_KEYS = ("fwd_bwd_start_bytes", "fwd_bwd_peak_bytes", "optimizer_start_bytes", "optimizer_peak_bytes",
              "buffer_bytes")  # the byte counts of a stage's record read off the line (buffer_bytes: constant)
FIRST_BLOCKS = 1  # the fewest blocks per stage sampled (tests/simulate/test_pipeline_extrapolation.py)


def simulate_pipeline_rank(
    card,
    layout: Layout,
    pipeline: PipelineSchedule,
    *,
    batch_size: int,
    seq_len: int,
    strategy: str = "none",
    k: int = 2,
    dtype: torch.dtype = torch.float32,
    precision: str = "pure",
    rank: int = 0,
    seed: int = 0,
    backend: str = "sdpa",
    extrapolate: bool = True,
    probe_class: type[ShardedLiveTensorProbe] = ResizeTrackingRankProbe,
    warmup: str = "primed",
    compile: CompileConfig | None = None,
) -> dict:
    """Rank ``rank`` of a ``pp x [dp_replicate x] dp_shard x [cp x] tp`` layout (rank ``r`` holds pipeline rank
    ``r // (dp_replicate * dp_shard * cp * tp)``'s stages, tensor parallel over the ``tp`` ranks of its group when
    ``layout.tp`` > 1, FSDP2 over ``(dp_replicate, dp_shard)`` with HSDP replicas, torch's ring over the ``cp`` ranks
    with context parallel): one warm step, then one step measured in the two windows of a real rank
    (``pipeline.memory_step``).

    ``extrapolate`` (default) reads the record off lines where the samples cost less than the step itself:

    - **microbatches** (``sample_microbatches``): a schedule of many microbatches (gradient accumulation: a 70B
      candidate of ``flashckpt fit`` runs 128) at a few smaller counts past the schedule's warm-up, the same rows
      per microbatch, its byte counts read off the line through them when every count steps by the same bytes
      (``simulated_microbatches``, their peaks ``microbatch_sample_peaks``; ``microbatches_extrapolated`` says
      whether the line held);
    - **depth**, at each of those counts: the card at a few smaller numbers of blocks per stage (every stage one
      block more at each step, ``layer_extrapolation.sample_depths`` with ``stages``), read off the line through
      them (``simulated_depths`` names the depths, ``sample_peaks`` their peaks, ``extrapolated`` says whether the
      line held).

    Else, or when the samples would run as many microbatches or stage blocks as the step, the step whole; both
    lines are checked against the whole step to the byte (tests/simulate/test_pipeline_extrapolation.py).
    ``probe_class``: the rank probe (``simulate.rank_probe``'s by default, the same bytes as
    ``distributed.memory``'s, faster). ``warmup``: how the rank reaches its measured step (``fake_ranks.warm_up``;
    ``"primed"`` initialises the stages with the schedule's own code, ``_initialize_stages``). ``compile``: compiled
    stages (each block compiled before ``fully_shard``, as ``distributed.rank`` compiles them) into Inductor's plans,
    two real warm-up steps and the probe made for compiled code (``fake_ranks._Compiled``); simulated whole (the
    depth and microbatch lines are checked eager only)."""
    if dist.is_initialized():
        raise RuntimeError("simulate_pipeline_rank needs a process without a process group (it starts the fake one)")
    layout.check_batch(batch_size)
    layout.check_card(card)
    pipeline.check(layout, batch_size=batch_size, n_blocks=card.n_layer)
    layout.check_sequence(seq_len)
    layout.check_stage_shards(seq_len, card.vocab_size)
    if layout.cp > 1:  # the ring runs the CPU flash op, as a gloo rank's does (distributed.context_parallel)
        backend = context_parallel.ring_backend("cpu")
    compiled = compile is not None and compile.enabled
    extrapolate = extrapolate and not compiled
    run = functools.partial(_simulate_stage, card, layout, seq_len=seq_len, strategy=strategy, k=k, dtype=dtype,
                            precision=precision, rank=rank, seed=seed, backend=backend, extrapolate=extrapolate,
                            probe_class=probe_class, warmup=warmup, compile=compile if compiled else None)
    counts = sample_microbatches(layout, pipeline) if extrapolate else []
    rows_per_microbatch = batch_size // pipeline.microbatches  # (over the data-parallel ranks)
    records, line = _first_line(
        counts, lambda count: run(dataclasses.replace(pipeline, microbatches=count), rows_per_microbatch * count),
        pipeline.microbatches)
    if line is not None:
        return {**records[max(records)], **line, **_sample_times(records), "microbatches_extrapolated": True,
                "simulated_microbatches": list(records), "microbatches": pipeline.microbatches,
                "microbatch_sample_peaks": {m: r["peak_bytes"] for m, r in records.items()}}
    record = run(pipeline, batch_size)
    if records:
        record.update(_sample_times(records, "microbatch_sample_"))
    record.update(microbatches_extrapolated=False, simulated_microbatches=[*records, pipeline.microbatches],
                  microbatches=pipeline.microbatches)
    return record


def simulate_first_and_last(card, layout: Layout, pipeline: PipelineSchedule, *, jobs: int = 1, **kwargs) -> dict:
    """The first and the last pipeline rank (``simulate_pipeline_rank``; the first holds the most in-flight
    activations, the last the head and the loss), the one with the larger peak as the record; ``ranks`` holds both
    ranks' peaks, the ``*_s`` times are summed. What ``flashckpt fit`` and a suite's pipeline scenario read.

    ``jobs`` >= 2 simulates the last rank in a spawned process while this one simulates the first
    (``simulate_side_by_side``): each fake rank is one Python thread's dispatch, so two ranks on two cores take the
    wall time of the slower one, at the cost of one process start (about the time of importing torch). The
    records are the same (tests/simulate/test_side_by_side_ranks.py); ``flashckpt fit`` passes 2 where the machine
    has two cores (reports/side-by-side-ranks.md)."""
    ranks = sorted({0, (layout.pp - 1) * layout.dp * layout.cp * layout.tp})  # mesh (pp, ..., tp): rank 0 of each
    run = functools.partial(simulate_pipeline_rank, card, layout, pipeline, **kwargs)
    records = simulate_side_by_side(run, ranks, jobs)
    record = max(records, key=lambda r: r["peak_bytes"])
    return {**record, "ranks": {r["rank"]: r["peak_bytes"] for r in records},
            **{key: sum(r[key] for r in records) for key in ("layout_s", "warm_step_s", "measured_step_s")}}


def simulate_side_by_side(run: Callable[..., dict], ranks: list[int], jobs: int = 1) -> list[dict]:
    """``run(rank=r)`` for every rank of ``ranks``, in order: here one after the other (``jobs`` 1), or the first
    here while the others run in up to ``jobs - 1`` spawned processes (a fork would copy this process's threads
    and torch's state; ``run`` must pickle: a module-level function or a ``functools.partial`` of one). A rank's
    error is raised here, as it would be run here."""
    if jobs < 2 or len(ranks) < 2:
        return [run(rank=rank) for rank in ranks]
    with ProcessPoolExecutor(max_workers=min(jobs - 1, len(ranks) - 1), mp_context=multiprocessing.get_context("spawn")) as pool:
        later = [pool.submit(run, rank=rank) for rank in ranks[1:]]
        first = run(rank=ranks[0])
        return [first, *(future.result() for future in later)]


def side_by_side_jobs() -> int:
    """How many ranks ``flashckpt fit`` simulates at once: two where this process may run on two cores (the cores
    it is pinned to where the platform says, as under ``taskset``; else the machine's)."""
    affinity = getattr(os, "sched_getaffinity", None)
    cores = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    return 2 if cores >= 2 else 1


def _first_line(samples: list[int], run: Callable[[int], dict], target: int) -> tuple[dict[int, dict], dict | None]:
    """Run the samples in order until the last ``POINTS`` of them give a line to ``target`` (``line_through``
    with ``STAGE_KEYS``): the records run, and the line (None when no window of them held one)."""
    records: dict[int, dict] = {}
    for sample in samples:
        records[sample] = run(sample)
        line = line_through(records, target, STAGE_KEYS)
        if line is not None:
            return records, line
    return records, None


# where the peak's growth per microbatch settles, in rounds of pp x stages_per_rank microbatches (measured on
# llama-tiny, tests/simulate/test_pipeline_extrapolation.py): 1F1B's first stage holds one activation more from 2 pp
# - 1 microbatches on (at pp 4 and 8), the others step alike from one round on
STEADY_ROUNDS = {"gpipe": 1, "1f1b": 2, "interleaved_1f1b": 1}


def sample_microbatches(layout: Layout, pipeline: PipelineSchedule) -> list[int]:
    """The microbatch counts to simulate, fewest first (up to ``MAX_SAMPLES``): from ``STEADY_ROUNDS`` rounds of
    one microbatch per stage (past the warm-up: torch's 1F1B schedules keep at most a round in flight on a rank), one
    more at each step (a round of ``pp`` more for the interleaved schedule, which runs them in rounds), each below the
    step's count; none (simulate the step whole) when fewer than ``POINTS`` remain or the first ``POINTS`` would run
    as many microbatches as the step."""
    step = layout.pp if pipeline.schedule == "interleaved_1f1b" else 1
    lowest = STEADY_ROUNDS[pipeline.schedule] * layout.pp * pipeline.stages_per_rank
    lowest = -(-lowest // step) * step
    counts = list(range(lowest, pipeline.microbatches, step))[:MAX_SAMPLES]
    if len(counts) < POINTS or sum(counts[:POINTS]) >= pipeline.microbatches:
        return []
    return counts


def _simulate_stage(card, layout: Layout, pipeline: PipelineSchedule, batch_size: int, *, seq_len: int,
                    strategy: str, k: int, dtype: torch.dtype, precision: str, rank: int, seed: int, backend: str,
                    extrapolate: bool, probe_class: type[ShardedLiveTensorProbe], warmup: str,
                    compile: CompileConfig | None = None) -> dict:
    """The rank at one microbatch count: read off the depth line where it is cheaper, else the card whole."""
    run = functools.partial(_simulate_stage_whole, layout=layout, pipeline=pipeline, batch_size=batch_size,
                            seq_len=seq_len, strategy=strategy, k=k, dtype=dtype, precision=precision, rank=rank,
                            seed=seed, backend=backend, probe_class=probe_class, warmup=warmup, compile=compile)
    stages = layout.pp * pipeline.stages_per_rank
    depths = sample_depths(card.n_layer, strategy, k, stages=stages, first=FIRST_BLOCKS) if extrapolate else []
    if sum(depths[:POINTS]) >= card.n_layer:  # (stage blocks grow with the depth: the samples would cost more)
        depths = []
    records, line = _first_line(depths, lambda depth: run(dataclasses.replace(card, n_layer=depth)), card.n_layer)
    if line is not None:
        return {**_extrapolated(records, line, card.n_layer),
                "sample_peaks": {d: r["peak_bytes"] for d, r in records.items()}}
    record = run(card)
    if records:
        record.update(_sample_times(records, "sample_"))
    record.update(extrapolated=False, simulated_depths=[*records, card.n_layer])
    return record


def _initialize_stages(trainer: pp.PipelineTrainer) -> None:
    """What the schedule's first step prepares before its first microbatch, without the step: each stage's forward
    and backward infrastructure (the receive buffers it keeps between steps), by the schedule's own stage
    initialisation from the first microbatch, as its ``step`` calls it (torch's private ``_initialize_stages`` of a
    multi-stage schedule, ``_initialize_stage`` of a single-stage one). ``warm_up``'s ``"primed"`` warm-up then
    leaves the optimizer state; tests/simulate/test_warm_up.py checks both against a real warm step, to the byte."""
    schedule = trainer.schedule
    x, y = trainer.batch()
    count = schedule._n_microbatches
    args = (x.tensor_split(count)[0],) if trainer.has_first else ()
    target = y.tensor_split(count)[0] if trainer.has_last else None
    initialize = getattr(schedule, "_initialize_stages", None) or schedule._initialize_stage
    with trainer.step_context():  # (loss_parallel, the ring: what the schedule's step runs under)
        initialize(args, {}, target)


def _simulate_stage_whole(card, *, layout: Layout, pipeline: PipelineSchedule, batch_size: int, seq_len: int,
                          strategy: str, k: int, dtype: torch.dtype, precision: str, rank: int, seed: int, backend: str,
                          probe_class: type[ShardedLiveTensorProbe], warmup: str = "primed",
                          compile: CompileConfig | None = None) -> dict:
    """One fake process group, the card built and split, warmed up (``fake_ranks.warm_up``) and the probed step. A
    compiled rank (``compile``) compiles each stage's blocks into Inductor's plans, warms up with two real steps
    and is read by ``rank_probe.CompiledRankProbe`` (``fake_ranks._Compiled``)."""
    compiled = None if compile is None else _Compiled(layout, strategy, compile, None)  # (enabled: the caller's check)
    started = time.perf_counter()
    forget_meshes()  # (a previous rank's DTensor caches hold its meshes: simulate.fake_ranks)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=layout.world_size)
    try:
        mesh = pp.make_mesh(layout)
        mixed = precision == "mixed"
        with contextlib.ExitStack() as stack:
            for context in (FakeTensorMode(allow_non_fake_inputs=True), _real_meshes(), _eager_collectives(),
                            *(() if compiled is None else compiled.contexts())):
                stack.enter_context(context)
            model = _build_fake(card, backend, torch.float32 if mixed else dtype, seed)
            trainer = pp.build_pipeline(model, layout, mesh, pipeline, batch_size=batch_size, seq_len=seq_len,
                                        seed=seed, activation=ActivationConfig(strategy=strategy, k=k),
                                        mp_policy=mixed_precision_policy(dtype) if mixed else None,
                                        before_shard=None if compiled is None else compiled.compile_blocks)
            del model
            built = time.perf_counter()
            with _static_warmup(trainer.schedule), _works_hold_their_tensors():
                if compiled is not None:
                    compiled.warm_up(trainer)
                    probe_class = compiled.probe_class
                else:
                    if warmup == "primed":
                        _initialize_stages(trainer)
                    warm_up(trainer, trainer.parameters(), warmup)
                warm = time.perf_counter()
                record = pp.memory_step(trainer, probe_class=probe_class)
        done = time.perf_counter()
    finally:
        dist.destroy_process_group()
        forget_meshes()
        if compiled is not None:
            torch._dynamo.reset()  # no compiled fake model stays in Dynamo's caches
    record.update(rank=rank, layout_s=built - started, warm_step_s=warm - built, measured_step_s=done - warm,
                  n_layer=card.n_layer)
    return record


def main(argv: list[str] | None = None) -> None:
    """``python -m pytest_flashckpt.simulate.pipeline CARD --pp 2 --schedule 1f1b --microbatches 4 --ranks 0,1
    ...``: on the last line of stdout, JSON ``{rank: record}`` (what the tests run in a fresh process)."""
    import argparse
    import json

    from pytest_flashckpt.models.cards import load_card

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("card")
    parser.add_argument("--overrides", default="{}", help="card overrides as JSON, e.g. '{\"n_layer\": 4}'")
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--dp-shard", type=int, default=1)
    parser.add_argument("--dp-replicate", type=int, default=1, help="HSDP replicas of the dp_shard group")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks inside each stage")
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--microbatches", type=int, default=2)
    parser.add_argument("--stages-per-rank", type=int, default=1)
    parser.add_argument("--ranks", default="0", help="comma-separated ranks to simulate, each in its own group")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--strategy", default="none")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--precision", default="pure", choices=("pure", "mixed"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-extrapolate", action="store_true", help="simulate the card whole (no depth extrapolation)")
    parser.add_argument("--exact-probe", action="store_true", help="the gloo ranks' probe (distributed.memory)")
    parser.add_argument("--warmup", default="primed", choices=WARMUPS, help="how the rank reaches its measured step (warm_up)")
    parser.add_argument("--jobs", type=int, default=1, help="ranks simulated at once (simulate_side_by_side)")
    args = parser.parse_args(argv)
    card = load_card(args.card, **json.loads(args.overrides))
    layout = Layout(dp_shard=args.dp_shard, tp=args.tp, pp=args.pp, dp_replicate=args.dp_replicate)
    pipeline = PipelineSchedule(args.schedule, args.microbatches, args.stages_per_rank)
    run = functools.partial(simulate_pipeline_rank, card, layout, pipeline, batch_size=args.batch, seq_len=args.seq,
                            strategy=args.strategy, dtype=getattr(torch, args.dtype), precision=args.precision,
                            seed=args.seed, extrapolate=not args.no_extrapolate,
                            probe_class=ShardedLiveTensorProbe if args.exact_probe else ResizeTrackingRankProbe,
                            warmup=args.warmup)
    ranks = [int(rank) for rank in args.ranks.split(",")]
    records = dict(zip(ranks, simulate_side_by_side(run, ranks, args.jobs)))
    print(json.dumps(records))


if __name__ == "__main__":
    main()
