"""The search: per GPU count, every candidate (``fit.candidates``), pruned by its exact state bytes, ranked by the
step-time model (``fit.time_model``), then simulated in that order (``fit.memory``) until ``top`` fit or
``max_simulations`` distinct simulations have run; the fastest that fits is chosen.

A candidate that holds at least what a simulated one that did not fit holds (``holds_at_least``: the same rank,
strategy, no less precise (mixed where it was pure), no smaller microbatch, no resharding where that one resharded, accumulated gradients where
that one had none) is ruled out without a simulation: its peak cannot be lower. Otherwise the search would spend
its simulations on microbatch after microbatch of one strategy that never fits.

The simulation budget is shared over the activation strategies (each gets an even share of what is left, in the
order of its fastest candidate; a share a strategy does not use passes on): in time order alone, the strategy the
time model favours (selective_op recomputes least) took every simulation on Llama-3-70B, each over the device, and
the search said "no layout fits" without trying full checkpointing. Within a strategy, candidates are simulated in
time order; the fitting layouts of every strategy are then ranked by time together.

Within a strategy, simulating in time order spends the simulations where the answer is decided: a slower layout is only simulated
once every faster one has been found not to fit (or ``top`` already fit). The usable memory is the device's less
``margin`` (a fraction, default ``fit.assumptions.DEFAULT_MARGIN``) for what the simulation does not count: the CUDA context,
NCCL's and cuBLAS's workspaces, the caching allocator's rounding and fragmentation. That margin is an assumption:
no GPU has measured it yet (``benchmarks/gpu_margin.py`` does, issue 32 item 8); the output states it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from pytest_flashckpt.fit.assumptions import DEFAULT_MARGIN, DEFAULT_MFU, DEFAULT_STORAGE_GBPS
from pytest_flashckpt.fit.candidates import (DEFAULT_SCHEDULES, STRATEGIES, Candidate, enumerate_candidates,
                                             state_lower_bound)
from pytest_flashckpt.fit.checkpoint_cost import CheckpointCost, checkpoint_cost
from pytest_flashckpt.fit.hardware import Device
from pytest_flashckpt.fit.memory import RankMemory, RankMemoryModel
from pytest_flashckpt.fit.time_model import StepTime, StepTimeModel
from pytest_flashckpt.simulate.fake_ranks import simulate_rank


@dataclass(frozen=True)
class FitRequest:
    card: object
    seq_len: int
    global_batch_tokens: int
    gpus: tuple[int, ...]
    device: Device
    device_memory: int
    strategies: tuple[str, ...] = STRATEGIES
    precisions: tuple[str, ...] = ("mixed",)
    tp: tuple[int, ...] | None = None
    max_microbatch: int = 16
    hsdp: bool = True
    k: int = 2
    margin: float = DEFAULT_MARGIN
    mfu: float = DEFAULT_MFU
    storage_gbps: float = DEFAULT_STORAGE_GBPS
    mtbf_hours: float | None = None
    top: int = 5
    max_simulations: int = 12
    pp: tuple[int, ...] = (1,)  # pipeline degrees searched (fit.candidates.pp_degrees)
    schedules: tuple[str, ...] = DEFAULT_SCHEDULES
    cp: tuple[int, ...] = ()  # context-parallel degrees above 1 searched (fit.candidates.cp_degrees)

    @property
    def usable_bytes(self) -> int:
        return int(self.device_memory * (1 - self.margin))


@dataclass(frozen=True)
class Ranked:
    """A candidate with its predicted time, its memory (None: not simulated) and its checkpoint cost."""

    candidate: Candidate
    time: StepTime
    memory: RankMemory | None
    checkpoint: CheckpointCost
    refused: str = ""  # why the simulation could not run it

    def fits(self, usable: int) -> bool:
        return self.memory is not None and self.memory.peak_bytes <= usable


@dataclass
class GpuCountResult:
    gpus: int
    enumerated: int = 0
    pruned_by_state: int = 0
    pruned_by_dominance: int = 0  # ruled out by a simulated candidate that did not fit and holds no more (holds_at_least)
    simulations: int = 0
    untried: int = 0  # layouts neither simulated nor pruned when the search stopped (the budget ran out, or enough fit)
    fitting: list[Ranked] = field(default_factory=list)
    not_fitting: list[Ranked] = field(default_factory=list)  # simulated, over the usable memory (or refused)
    closest_state: tuple[Candidate, int] | None = None  # the smallest state lower bound when every one was pruned

    @property
    def chosen(self) -> Ranked | None:
        return self.fitting[0] if self.fitting else None

    def closest(self) -> Ranked | None:
        simulated = [r for r in self.not_fitting if r.memory is not None]
        return min(simulated, key=lambda r: r.memory.peak_bytes) if simulated else None


# mixed holds at least what pure bf16 holds at the same layout: fp32 master weights, gradients and moments
# (fit.candidates.STATE_BYTES_PER_PARAM: 16 B against 8 B a parameter), an fp32 residual stream under autocast, and
# the same bf16 all-gathers (MixedPrecisionPolicy's param_dtype)
PRECISION_HOLDS = {"pure": 0, "mixed": 1}


def holds_at_least(c: Candidate, over: Candidate) -> bool:
    """True when rank memory of ``c`` is at least that of ``over`` (see the module doc): every axis of the rank the
    same, and each difference one that only adds (mixed where that one is pure, a larger microbatch, FSDP2 keeping the gathered blocks, gradients
    accumulated over microbatches). HSDP replicas add nothing to a rank (``fit.memory``)."""
    same_rank = (c.dp_shard, c.tp, c.pp, c.cp, c.strategy, c.k, c.schedule, c.stages_per_rank) == (
        over.dp_shard, over.tp, over.pp, over.cp, over.strategy, over.k, over.schedule, over.stages_per_rank)
    same_rank = same_rank and PRECISION_HOLDS[c.precision] >= PRECISION_HOLDS[over.precision]
    if c.pp > 1:  # a pipeline's microbatches are in its simulation: only the same schedule at a larger microbatch
        return same_rank and c.accumulation == over.accumulation and c.microbatch >= over.microbatch
    return (same_rank and c.microbatch >= over.microbatch
            and (over.reshard_after_forward or not c.reshard_after_forward)
            and (c.accumulation > 1 or over.accumulation == 1))


def search(request: FitRequest, simulate: Callable[..., dict] | None = None,
           progress: Callable[[str], None] | None = None,
           simulate_stage: Callable[..., dict] | None = None) -> list[GpuCountResult]:
    """The ranked fitting layouts per GPU count of ``request`` (see the module doc); ``simulate``: the rank
    simulation (None: ``simulate.fake_ranks.simulate_rank``; a test hands a stand-in), ``simulate_stage`` the
    pipeline ranks' (None: ``fit.memory``'s first and last rank of ``simulate.pipeline``)."""
    card = request.card
    memory = RankMemoryModel(card, request.seq_len, simulate or simulate_rank, simulate_stage)
    times = StepTimeModel(card, request.seq_len, request.device, request.mfu)
    parameters = card.num_params()
    enumerated = {  # every GPU count's request checked before anything simulates
        gpus: enumerate_candidates(
            card, gpus, seq_len=request.seq_len, global_batch_tokens=request.global_batch_tokens,
            gpus_per_node=request.device.gpus_per_node, strategies=request.strategies, precisions=request.precisions,
            tp=request.tp, max_microbatch=request.max_microbatch, hsdp=request.hsdp, k=request.k, pp=request.pp,
            schedules=request.schedules, cp=tuple(c for c in request.cp if gpus % c == 0))
        for gpus in request.gpus}
    results = []
    for gpus, candidates in enumerated.items():
        found = GpuCountResult(gpus)
        found.enumerated = len(candidates)
        # exact state bytes, plus the unsharded blocks a rank keeps without reshard_after_forward (fit.memory)
        bounds = {c: state_lower_bound(parameters, c) + (0 if c.reshard_after_forward else memory.unsharded_blocks(c))
                  for c in candidates}
        survivors = [c for c in candidates if bounds[c] <= request.usable_bytes]
        found.pruned_by_state = len(candidates) - len(survivors)
        if not survivors:
            found.closest_state = min(bounds.items(), key=lambda item: item[1])
        ranked = sorted(((times.step(c), c) for c in survivors), key=lambda pair: pair[0].step_s)
        by_strategy: dict[tuple[str, int], list] = {}
        for pair in ranked:  # each strategy's candidates fastest first; strategies in the order of their fastest
            by_strategy.setdefault((pair[1].strategy, pair[1].k), []).append(pair)
        left = len(by_strategy)
        for pairs in by_strategy.values():
            share = (request.max_simulations - found.simulations) // left
            left -= 1
            _search_strategy(request, memory, parameters, found, pairs, found.simulations + share, progress)
        found.untried = len(survivors) - len(found.fitting) - len(found.not_fitting) - found.pruned_by_dominance
        found.fitting = sorted(found.fitting, key=lambda r: r.time.step_s)[:request.top]
        results.append(found)
    return results


def _search_strategy(request: FitRequest, memory: RankMemoryModel, parameters: int, found: GpuCountResult,
                     ranked: list, until: int, progress: Callable[[str], None] | None) -> None:
    """One strategy's candidates, fastest first, simulated until ``top`` of them fit or the simulation count of
    ``found`` reaches ``until`` (this strategy's share of the budget: see the module doc). A miss sends the search
    to the least-holding members of the missed layout's rank group next (``_least_holding``): if they miss too,
    dominance prunes the whole group, so the budget moves on to the next tp / pp / cp instead of trying the same
    rank at microbatch after microbatch (the 405B search spent all 12 simulations on tp 2 that way)."""
    gpus, fitting = found.gpus, 0
    queue = list(ranked)
    while queue and fitting < request.top:
        time, c = queue.pop(0)
        if any(r.candidate == c for r in (*found.fitting, *found.not_fitting)):
            continue  # tried already, moved ahead after a miss
        if any(holds_at_least(c, r.candidate) for r in found.not_fitting if r.memory is not None):
            found.pruned_by_dominance += 1
            continue
        if not memory.is_cached(c):
            if found.simulations >= until:
                break
            found.simulations += 1
            if progress is not None:
                progress(f"{gpus} GPUs: simulating {c.describe()}, microbatch {c.microbatch}, {c.describe_strategy()}, "
                         f"{c.precision} ({found.simulations}/{request.max_simulations})")
        try:
            rank = memory.memory(c)
        except ValueError as exc:  # a layout the engine refuses (e.g. TP of a fused q/k/v projection)
            found.not_fitting.append(Ranked(c, time, None, _cost(request, parameters, c, None), str(exc).splitlines()[0]))
            continue
        entry = Ranked(c, time, rank, _cost(request, parameters, c, rank))
        if entry.fits(request.usable_bytes):
            found.fitting.append(entry)
            fitting += 1
        else:
            found.not_fitting.append(entry)
            least = _least_holding([pair for pair in queue if _rank_group(pair[1]) == _rank_group(c)])
            queue = least + [pair for pair in queue if pair not in least]


def _rank_group(c: Candidate) -> tuple:
    """What a rank's memory is made of, but for the precision, microbatch, accumulation and resharding
    (``holds_at_least``)."""
    return (c.dp_shard, c.tp, c.pp, c.cp, c.strategy, c.k, c.schedule, c.stages_per_rank)


def _least_holding(pairs: list) -> list:
    """The (time, candidate) pairs of one rank group that hold no more than any other of the group (none holds
    strictly less), fastest first: every other member holds at least one of them."""
    def strictly_more(a: Candidate, b: Candidate) -> bool:
        return holds_at_least(a, b) and not holds_at_least(b, a)

    least, seen = [], []
    for time, c in pairs:
        if any(strictly_more(c, o) for _, o in pairs) or any(holds_at_least(c, o) and holds_at_least(o, c) for o in seen):
            continue
        least.append((time, c))
        seen.append(c)
    return least


def _cost(request: FitRequest, parameters: int, c: Candidate, rank: RankMemory | None) -> CheckpointCost:
    return checkpoint_cost(parameters, c, request.device.gpus_per_node,
                           state_bytes=None if rank is None else rank.state_bytes,
                           storage_gbps=request.storage_gbps, mtbf_hours=request.mtbf_hours)
