"""A candidate's per-rank peak: one memory source per layout axis, then what the search adds on top.

``AXIS_SOURCES`` says, per axis of a layout, how its memory is known: ``dp_shard`` and ``tp`` are simulated by the
real engine under fake mode (``simulate.fake_ranks.simulate_rank``: torch's ``fully_shard`` and
``parallelize_module`` on a fake process group, the rank's live tensors phase by phase); ``dp_replicate`` (HSDP)
adds nothing to a rank (a replica holds the same shards: the rank is the ``dp_shard x tp`` rank with the same
microbatch); ``pp`` is simulated by the same engine running torch's pipelining schedule
(``simulate.pipeline.simulate_pipeline_rank``: the stage split, tensor parallel inside it, ``fully_shard`` per stage, the schedule's own
in-flight microbatches and receive buffers), a deep card's stage read off the line through fewer blocks per stage.
A pipeline candidate's peak is the larger of its first and its last pipeline rank's (the first stage holds the most
in-flight microbatches under 1F1B and the embedding, the last the head, its logits and the loss; the stages between
hold neither and fewer in flight, and are not simulated). ``cp`` is simulated by the same engine as ``dp_shard``
and ``tp``: ``simulate_rank`` of the ``dp_shard x cp x tp`` layout runs torch's ring attention on the fake process
group (``distributed.context_parallel``, with the CPU flash op as every fake rank here runs; equal to the byte to
gloo ranks, reports/spike-cp-ranks.md), FSDP2 sharding over ``dp_shard x cp``; inside pipeline stages by the
pipeline's simulation with the ring in every stage's blocks (reports/spike-cp-stages.md).

On top of the simulated step, two things the step does not contain are modelled and labelled so:

- gradient accumulation: the simulated step starts with no gradients; with ``accumulation > 1`` every microbatch
  after the first runs forward and backward over the accumulated (sharded) gradients, so the peak is at least the
  forward+backward peak plus the gradients, read exactly from the simulation (the optimizer window starts at the
  state plus the gradients, the forward+backward window at the state alone).
- ``reshard_after_forward=False``: FSDP2 keeps every block's all-gathered parameters from its forward to its
  backward; ``simulate_rank`` always reshards (FSDP2's default), so the unsharded block parameters
  (``(1 - 1/dp_shard)`` of the block parameters a TP rank holds, in the compute dtype) are added.

Simulations are cached by their distinct inputs (``RankInputs``): candidates that differ only in HSDP replicas, the
accumulation or ``reshard_after_forward`` share one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from pytest_flashckpt.config.layout import Layout, PipelineSchedule
from pytest_flashckpt.fit.candidates import COMPUTE_BYTES, Candidate
from pytest_flashckpt.simulate.fake_ranks import simulate_rank


@dataclass(frozen=True)
class RankInputs:
    """What one simulation of a rank depends on (the cache key)."""

    dp_shard: int
    tp: int
    batch_size: int  # the data-parallel group's microbatch: microbatch x dp_shard (x the pipeline's microbatches)
    seq_len: int
    strategy: str
    k: int
    precision: str
    pp: int = 1
    schedule: str = "1f1b"
    microbatches: int = 1  # the pipeline schedule's
    stages_per_rank: int = 1
    cp: int = 1


@dataclass(frozen=True)
class RankMemory:
    """A candidate's per-rank bytes: ``peak_bytes`` (what is compared with the usable memory), the simulated
    record it came from, and how each part is known."""

    peak_bytes: int
    simulated_peak_bytes: int
    state_bytes: int  # parameters + optimizer state of the rank (simulated: the forward+backward window's start)
    gradient_bytes: int
    added: dict[str, int]  # modelled additions by name
    simulated_s: float
    label: str = "simulated"  # how the rank's step is known

    @property
    def source(self) -> str:
        return self.label + "".join(f" + {name} (modelled)" for name, nbytes in self.added.items() if nbytes)


def _simulated_axes(candidate: Candidate) -> str | None:
    return None


# axis -> a check that returns why a candidate's memory cannot be known on that axis (None: known, see the doc)
AXIS_SOURCES: dict[str, Callable[[Candidate], str | None]] = {
    "dp_shard": _simulated_axes,
    "tp": _simulated_axes,
    "dp_replicate": _simulated_axes,  # the dp_shard x tp rank itself
    "pp": _simulated_axes,  # simulate.pipeline: the first and the last pipeline rank
    "cp": _simulated_axes,  # the dp_shard x cp x tp rank: torch's ring on the fake process group
}


def unknown_axis(candidate: Candidate) -> str | None:
    """Why no memory source covers ``candidate`` (None: every axis has one)."""
    return next((why for check in AXIS_SOURCES.values() if (why := check(candidate)) is not None), None)


def _simulate_stages(card, layout: Layout, pipeline: PipelineSchedule, **kwargs) -> dict:
    from pytest_flashckpt.simulate.pipeline import side_by_side_jobs, simulate_first_and_last

    return simulate_first_and_last(card, layout, pipeline, jobs=side_by_side_jobs(), **kwargs)


def block_parameters(card) -> int:
    """The parameters outside the embedding and an untied head: what FSDP2 all-gathers block by block."""
    tied = getattr(card, "tie_word_embeddings", True)
    return card.num_params() - card.vocab_size * card.n_embd * (1 if tied else 2)


class RankMemoryModel:
    """Per-rank peaks of candidates of one card and sequence length, simulated once per distinct ``RankInputs``."""

    def __init__(self, card, seq_len: int, simulate: Callable[..., dict] = simulate_rank,
                 simulate_stage: Callable[..., dict] | None = None) -> None:
        self.card = card
        self.seq_len = seq_len
        self.simulate = simulate
        self.simulate_stage = simulate_stage or _simulate_stages
        self.records: dict[RankInputs, dict] = {}

    def inputs(self, candidate: Candidate) -> RankInputs:
        c = candidate
        if c.pp == 1:
            return RankInputs(c.dp_shard, c.tp, c.microbatch * c.dp_shard, self.seq_len, c.strategy, c.k, c.precision,
                              cp=c.cp)
        return RankInputs(c.dp_shard, c.tp, c.microbatch * c.accumulation * c.dp_shard, self.seq_len, c.strategy, c.k,
                          c.precision, c.pp, c.schedule, c.accumulation, c.stages_per_rank, cp=c.cp)

    def is_cached(self, candidate: Candidate) -> bool:
        return self.inputs(candidate) in self.records

    def record(self, candidate: Candidate) -> dict:
        """The simulated rank (cached); a ValueError with the engine's reason, cached too, for one it refuses."""
        key = self.inputs(candidate)
        if key not in self.records:
            try:
                if key.pp > 1:
                    self.records[key] = self.simulate_stage(
                        self.card, Layout(dp_shard=key.dp_shard, tp=key.tp, pp=key.pp, cp=key.cp),
                        PipelineSchedule(key.schedule, key.microbatches, key.stages_per_rank), batch_size=key.batch_size,
                        seq_len=key.seq_len, strategy=key.strategy, k=key.k, dtype=torch.bfloat16,
                        precision=key.precision)
                else:
                    self.records[key] = self.simulate(
                        self.card, Layout(dp_shard=key.dp_shard, tp=key.tp, cp=key.cp), batch_size=key.batch_size,
                        seq_len=key.seq_len, strategy=key.strategy, k=key.k, dtype=torch.bfloat16,
                        precision=key.precision)
            except ValueError as exc:
                self.records[key] = {"refused": str(exc).splitlines()[0]}
        if "refused" in self.records[key]:
            raise ValueError(self.records[key]["refused"])
        return self.records[key]

    def memory(self, candidate: Candidate) -> RankMemory:
        why = unknown_axis(candidate)
        if why is not None:
            raise ValueError(why)
        record = self.record(candidate)
        state = record["fwd_bwd_start_bytes"]
        gradients = record["optimizer_start_bytes"] - state
        pipelined = candidate.pp > 1  # the schedule's microbatches and FSDP2's kept blocks are in the simulation
        added = {
            "accumulated gradients": gradients if candidate.accumulation > 1 and not pipelined else 0,
            "unsharded block parameters": (self.unsharded_blocks(candidate)
                                           if not candidate.reshard_after_forward and not pipelined else 0),
        }
        fwd_bwd = record["fwd_bwd_peak_bytes"] + sum(added.values())
        return RankMemory(max(fwd_bwd, record["optimizer_peak_bytes"]), record["peak_bytes"], state, gradients,
                          added, sum(record.get(key, 0.0) for key in ("layout_s", "warm_step_s", "measured_step_s")))

    def unsharded_blocks(self, candidate: Candidate) -> int:
        held = block_parameters(self.card) // (candidate.tp * candidate.pp)
        shards = candidate.dp_shard * candidate.cp  # FSDP2's group: dp_shard x cp
        return held * COMPUTE_BYTES * (shards - 1) // shards
