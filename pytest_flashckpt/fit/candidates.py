"""The layouts ``flashckpt fit`` considers for one GPU count, and the cheap exact facts that rule some out.

A candidate is a point of: data parallel (``dp_shard`` FSDP ranks, times ``dp_replicate`` HSDP replicas) x tensor
parallel ``tp`` (dividing the query and key/value heads, at most one node's GPUs: TP's collectives are on the
critical path, so they stay on NVLink) x the microbatch per data-parallel rank and gradient accumulation (global
batch tokens = dp x microbatch x seq x accumulation) x FSDP2's ``reshard_after_forward`` x activation strategy x
precision x pipeline stages: ``pp`` ranks (``--pp``), each schedule (torch's ``Schedule1F1B``,
``ScheduleInterleaved1F1B`` with 2 stages per rank, ``ScheduleGPipe`` on request), where ``accumulation`` is the
schedule's microbatch count (one schedule step per optimizer step: the microbatches are the pipeline's). Pipeline
stages are composed with FSDP and tensor parallel (``distributed.pipeline``: the ``(pp, dp_shard, tp)`` mesh; a tp
degree inside stages also divides the sequence and the vocabulary, what the stages send and return; HSDP replicas
inside stages too, a replica's rank holding what the stage rank of its shard group holds:
reports/spike-hsdp-ranks.md) and FSDP2 keeps the gathered blocks over the microbatches (``reshard_after_forward`` false, torchtitan's default under
pipelining) x context parallel: ``cp`` ranks sharing each sequence (``--cp``; by default searched from 32K tokens
on), composed as torchtitan composes it (``distributed.context_parallel``): FSDP2 shards over ``dp_shard x cp``
(every rank of a cp group holds a shard of the state), tensor parallel inside, HSDP replicas over whole nodes, in
either precision, and inside pipeline stages (the ``(pp, dp_shard, cp, tp)`` mesh: each stage's blocks run the ring,
FSDP2 over each stage group's ``dp_shard x cp``; reports/spike-cp-stages.md), Llama 3's own 128K layout.

The first prune is exact and needs no simulation: the training state a rank must hold (parameters, gradients, the
two AdamW moments), with the parameters split evenly over ``dp_shard x cp x tp x pp`` ranks, is a lower bound of its peak
(FSDP2 pads shards and TP replicates the norms, which only adds); a layout whose state alone exceeds the usable
memory cannot fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_flashckpt.config.errors import InputError
from pytest_flashckpt.config.layout import Layout, PipelineSchedule, stage_shard_refusal
from pytest_flashckpt.core.registry import fit_strategies

# bytes per parameter of (parameter, gradient, AdamW exp_avg + exp_avg_sq): pure bf16 holds all four in bf16; mixed
# holds float32 master weights, float32 gradients (FSDP2's reduce_dtype) and float32 moments
STATE_BYTES_PER_PARAM = {"pure": 2 + 2 + 2 * 2, "mixed": 4 + 4 + 2 * 4}
# bytes per parameter a DCP checkpoint stores (parameters and both moments, no gradients)
SAVED_BYTES_PER_PARAM = {"pure": 2 + 2 * 2, "mixed": 4 + 2 * 4}
COMPUTE_BYTES = 2  # bf16: what FSDP2 all-gathers (MixedPrecisionPolicy param_dtype, or the bf16 parameters of pure)
STRATEGIES = fit_strategies()  # the registry's rows with a fit_order, least recomputation first
PIPELINE_SCHEDULES = {"1f1b": 1, "interleaved_1f1b": 2, "gpipe": 1}  # schedule -> stages per rank searched
DEFAULT_SCHEDULES = ("1f1b", "interleaved_1f1b")
DEFAULT_PP = (1, 2, 4, 8, 16)
DEFAULT_CP = (2, 4, 8)  # searched by default from LONG_SEQUENCE tokens on
LONG_SEQUENCE = 32768


@dataclass(frozen=True)
class Candidate:
    """One layout of ``gpus`` GPUs (see the module doc); ``microbatch`` sequences per data-parallel rank per
    forward, ``accumulation`` forwards per optimizer step."""

    gpus: int
    dp_shard: int
    tp: int
    microbatch: int
    accumulation: int
    strategy: str
    precision: str
    reshard_after_forward: bool = True
    dp_replicate: int = 1
    pp: int = 1
    cp: int = 1
    k: int = 2
    schedule: str = "1f1b"  # pipeline schedule (pp > 1): gpipe, 1f1b, interleaved_1f1b
    stages_per_rank: int = 1  # pipeline stages a rank holds (interleaved_1f1b: 2)

    @property
    def dp(self) -> int:
        return self.dp_shard * self.dp_replicate

    def describe(self) -> str:
        """``fsdp 2 x tp 4 x cp 2``: FSDP2 shards over ``dp_shard x cp`` ranks where cp is there (torchtitan's)."""
        parts = [f"hsdp {self.dp_replicate}x{self.dp_shard}" if self.dp_replicate > 1 else f"fsdp {self.dp_shard}"]
        parts += [f"{axis} {getattr(self, axis)}" for axis in ("tp", "pp", "cp") if getattr(self, axis) > 1]
        if self.pp > 1:
            parts[-1 if self.cp == 1 else -2] += f" ({self.schedule}{'' if self.stages_per_rank == 1 else f', {self.stages_per_rank} stages per rank'})"
        return " x ".join(parts)

    @property
    def pipeline_stages(self) -> int:
        return self.pp * self.stages_per_rank

    def describe_strategy(self) -> str:
        return f"every_k (k={self.k})" if self.strategy == "every_k" else self.strategy


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tp_degrees(card, gpus: int, gpus_per_node: int, requested: tuple[int, ...] | None = None) -> list[int]:
    """The TP degrees of ``gpus``: dividing the GPU count and both head counts, at most a node. A requested degree
    the heads or the node cannot take is an ``InputError`` naming it."""
    heads = {"n_head": card.n_head, "n_kv_head": getattr(card, "n_kv_head", card.n_head)}
    for tp in requested or ():
        for key, count in heads.items():
            if count % tp:
                raise InputError(f"--tp {tp}: model card {card.name!r} has {key} {count}, not divisible by {tp}; "
                                 f"choose a tp that divides {count} (a rank holds whole heads)")
        if tp > gpus_per_node:
            raise InputError(f"--tp {tp}: more than the {gpus_per_node} GPUs of a node (tensor parallel's collectives "
                             "are on the critical path: they stay on NVLink); choose tp <= --gpus-per-node")
    options = requested or tuple(divisors(gpus_per_node))
    return [tp for tp in options if gpus % tp == 0 and tp <= gpus_per_node and all(c % tp == 0 for c in heads.values())]


def sequences_per_step(global_batch_tokens: int, seq_len: int) -> int:
    if global_batch_tokens % seq_len:
        raise InputError(f"--global-batch-tokens {global_batch_tokens} is not a multiple of --seq {seq_len}: a step "
                         f"trains whole sequences; use a multiple, e.g. {max(1, global_batch_tokens // seq_len) * seq_len}")
    return global_batch_tokens // seq_len


def pp_degrees(card, gpus: int, requested: tuple[int, ...] | None = None,
               schedules: tuple[str, ...] = DEFAULT_SCHEDULES) -> list[int]:
    """The pipeline degrees of ``gpus``: dividing the GPU count, at most one stage per block (``requested``: each
    checked, an ``InputError`` naming the fix; default ``DEFAULT_PP``)."""
    tied = getattr(card, "tie_word_embeddings", False)
    for pp in requested or ():
        if pp > 1 and tied:
            raise InputError(f"--pp {pp}: model card {card.name!r} ties its head to the embedding, which the first and "
                             "last stages cannot share; use an untied card or --pp 1")
        fewest = pp * min(PIPELINE_SCHEDULES[s] for s in schedules)
        if fewest > card.n_layer:
            raise InputError(f"--pp {pp}: {fewest} stages for model card {card.name!r}'s {card.n_layer} blocks; use "
                             f"--pp {card.n_layer} or fewer")
        if gpus % pp:
            raise InputError(f"--pp {pp}: does not divide --gpus {gpus}; choose a degree that divides every GPU count")
    options = requested or tuple(p for p in DEFAULT_PP if p == 1 or not tied)
    return [p for p in options if gpus % p == 0 and p <= card.n_layer]


def enumerate_candidates(
    card,
    gpus: int,
    *,
    seq_len: int,
    global_batch_tokens: int,
    gpus_per_node: int,
    strategies: tuple[str, ...] = STRATEGIES,
    precisions: tuple[str, ...] = ("mixed",),
    tp: tuple[int, ...] | None = None,
    max_microbatch: int = 16,
    hsdp: bool = True,
    k: int = 2,
    pp: tuple[int, ...] = (1,),
    schedules: tuple[str, ...] = DEFAULT_SCHEDULES,
    cp: tuple[int, ...] = (),
) -> list[Candidate]:
    """Every candidate of ``gpus`` GPUs (see the module doc). An ``InputError`` when none exists: no TP degree
    divides the GPUs and heads, or the batch cannot be split into whole sequences per data-parallel rank."""
    sequences = sequences_per_step(global_batch_tokens, seq_len)
    degrees = tp_degrees(card, gpus, gpus_per_node, tp)
    check_stage_shards(card, seq_len, tp, pp)
    if not degrees:
        raise InputError(f"--gpus {gpus}: no tensor-parallel degree divides both {gpus} GPUs and model card "
                         f"{card.name!r}'s heads (n_head {card.n_head}, n_kv_head {getattr(card, 'n_kv_head', card.n_head)}) "
                         f"within a node of {gpus_per_node}; use a GPU count that is a multiple of one")
    found: list[Candidate] = []
    options = _Options(strategies, precisions, schedules, max_microbatch, k)
    for c in (1, *cp):  # cp 1 first: FSDP / HSDP x tp x pp, then each cp degree composed with them
        for p in pp:
            for t in degrees:
                if gpus % (c * t * p) or (c > 1 and (seq_len // c) % t):  # sp splits a cp rank's share of the sequence
                    continue
                if p > 1 and stage_shard_refusal(t, seq_len // c, card.vocab_size) is not None:
                    continue
                for replicate, shard, per_rank in _data_parallel(gpus // (c * t * p), sequences, c * t, hsdp, gpus_per_node):
                    found += _variants(card, gpus, replicate, shard, t, p, c, per_rank, options)
    if not found:
        smallest_dp = gpus // max(degrees) // max(pp)
        raise InputError(
            f"--gpus {gpus}: the global batch of {sequences} sequences ({global_batch_tokens} tokens / seq {seq_len}) "
            f"cannot be split: every data-parallel rank needs whole sequences (and a pipeline at least a microbatch per "
            f"stage) and the fewest data-parallel ranks here are {smallest_dp} (tp {max(degrees)}, pp {max(pp)}); use a "
            f"batch of a multiple of {smallest_dp} sequences or fewer GPUs")
    return found


def _data_parallel(dp: int, sequences: int, span: int, hsdp: bool, gpus_per_node: int):
    """``(replicas, shard, sequences per data-parallel rank)`` for ``dp`` data-parallel ranks, each spanning ``span``
    GPUs of a node (tp, or cp x tp): none where the sequences do not split evenly; FSDP over all of them, and (with
    ``hsdp``) HSDP replicas of a shard group that spans whole nodes (replicas across nodes, torchtitan's way)."""
    if sequences % dp:
        return
    for replicate in divisors(dp) if hsdp else [1]:
        shard = dp // replicate
        if replicate == 1 or (shard * span) % gpus_per_node == 0:
            yield replicate, shard, sequences // dp


def cp_degrees(card, gpus: int, seq_len: int, requested: tuple[int, ...] | None = None) -> list[int]:
    """The context-parallel degrees of ``gpus`` (above 1): dividing the GPU count, ``2 cp`` dividing the sequence
    (torch's load-balanced ring, ``config.layout``); ``requested`` each checked, an ``InputError`` naming the fix;
    by default ``DEFAULT_CP`` from ``LONG_SEQUENCE`` tokens on, none below."""
    for c in requested or ():
        if c > 1 and gpus % c:
            raise InputError(f"--cp {c}: does not divide --gpus {gpus}; choose a degree that divides every GPU count")
        if c > 1 and seq_len % (2 * c):
            raise InputError(f"--cp {c}: --seq {seq_len} is not divisible by 2 x cp = {2 * c} (torch's load-balanced "
                             f"ring gives each rank two chunks); use a multiple of {2 * c}")
    options = requested or (DEFAULT_CP if seq_len >= LONG_SEQUENCE else ())
    return [c for c in options if c > 1 and gpus % c == 0 and seq_len % (2 * c) == 0]


@dataclass(frozen=True)
class _Options:
    """The choices every layout of the search is crossed with."""

    strategies: tuple[str, ...]
    precisions: tuple[str, ...]
    schedules: tuple[str, ...]
    max_microbatch: int
    k: int


def _variants(card, gpus: int, replicate: int, shard: int, t: int, p: int, c: int, per_rank: int,
              options: _Options) -> list[Candidate]:
    """One layout's candidates: each microbatch dividing a data-parallel rank's sequences, each schedule that runs
    (with stages), strategy, precision and ``reshard_after_forward`` (kept gathered under pipelining, torchtitan's
    default; both where FSDP2 shards over more than one rank)."""
    found = []
    for mb in (m for m in divisors(per_rank) if m <= options.max_microbatch):
        for schedule in options.schedules if p > 1 else ("1f1b",):
            virtual = PIPELINE_SCHEDULES[schedule] if p > 1 else 1
            if p > 1 and not _schedulable(schedule, p, virtual, per_rank // mb, card.n_layer):
                continue
            for strategy in options.strategies:
                for precision in options.precisions:
                    for reshard in (False,) if p > 1 else (True, False) if shard * c > 1 else (True,):
                        found.append(Candidate(gpus, shard, t, mb, per_rank // mb, strategy, precision, reshard,
                                               replicate, pp=p, cp=c, k=options.k, schedule=schedule,
                                               stages_per_rank=virtual))
    return found


def check_stage_shards(card, seq_len: int, tp: tuple[int, ...] | None, pp: tuple[int, ...]) -> None:
    """A requested tp degree that no requested pipeline degree can take inside its stages: an ``InputError`` naming
    the sequence or vocabulary it does not divide (only when every requested layout is pipelined)."""
    if not tp or 1 in pp:
        return
    for t in tp:
        refusal = stage_shard_refusal(t, seq_len, card.vocab_size)
        if refusal is not None:
            raise InputError(f"--tp {t} with --pp {','.join(map(str, pp))}: {refusal}")


def _schedulable(schedule: str, pp: int, virtual: int, microbatches: int, n_blocks: int) -> bool:
    """What the simulation accepts (``config.layout.PipelineSchedule.check``, torch's schedules' rules): stages <=
    blocks, 1F1B at least a microbatch per stage, interleaved in rounds of ``pp`` (or fewer than ``pp``)."""
    try:
        PipelineSchedule(schedule, microbatches, virtual).check(Layout(pp=pp), batch_size=microbatches, n_blocks=n_blocks)
    except ValueError:
        return False
    return True


def state_lower_bound(parameters: int, candidate: Candidate) -> int:
    """The bytes of training state a rank of ``candidate`` holds at least (see the module doc)."""
    shards = candidate.dp_shard * candidate.cp * candidate.tp * candidate.pp
    return -(-parameters // shards) * STATE_BYTES_PER_PARAM[candidate.precision]
