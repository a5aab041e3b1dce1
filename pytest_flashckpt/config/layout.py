"""A parallel layout: how the ranks of a run split the work (issue 32).

``Layout(dp_shard, tp, pp=1, cp=1, dp_replicate=1)``: ``dp_shard`` ranks shard parameters, gradients and optimizer
state with FSDP2 and split the batch, ``dp_replicate`` replicas of them (HSDP) split it further; ``tp`` ranks split
every block's matmuls (tensor parallel, with sequence parallel on the norms); ``pp`` ranks hold consecutive
pipeline stages of the blocks (``distributed.pipeline``, torch's ``torch.distributed.pipelining``); ``cp`` ranks
split the sequence (context parallel, torch's ring attention, ``distributed.context_parallel``). The world is the
product of the axes. ``PipelineSchedule`` says how the
stages run: the schedule, the microbatches and the stages each rank holds.

The checks are the ones a layout request can fail before anything runs: every axis a positive integer, the world
equal to the product, the attention heads (query and key/value) divisible by ``tp`` (a column shard of q/k/v must
hold whole heads), the batch divisible by ``dp_replicate x dp_shard`` (every data-parallel rank reads an equal
share), no more stages than blocks, microbatches that divide a data-parallel rank's batch (and, for 1F1B, at least one per stage),
a sequence divisible by ``cp`` (by ``2 * cp`` for the load-balanced ring, which gives every rank one chunk from
each end of the causal mask). They raise ``ValueError`` naming the axis and the fix; callers place it
(``ConfigError.within``, the CLI's ``InputError``).
"""

from __future__ import annotations

from dataclasses import dataclass

AXES = ("dp_replicate", "dp_shard", "tp", "pp", "cp")


@dataclass(frozen=True)
class Layout:
    """Ranks per axis; ``world_size`` is their product. Mesh dimension order: ("dp_shard", "tp") as torchtitan, with
    ``dp_replicate`` (HSDP: replicas of the ``dp_shard`` group, FSDP2 over the 2D ``(dp_replicate, dp_shard)`` mesh)
    first where it is above 1."""

    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    dp_replicate: int = 1

    def __post_init__(self) -> None:
        for axis in AXES:
            value = getattr(self, axis)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"layout {axis} must be a positive integer, got {value!r}")

    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        """The data-parallel ranks: every one reads its own share of the batch (HSDP replicas too)."""
        return self.dp_replicate * self.dp_shard

    @property
    def is_2d(self) -> bool:
        return self.dp_shard > 1 and self.tp > 1

    @classmethod
    def for_world(cls, world_size: int, tp: int = 1, pp: int = 1, cp: int = 1) -> "Layout":
        """The layout of ``world_size`` ranks with ``tp``-way tensor parallel, ``pp`` stages, ``cp``-way context
        parallel and FSDP over the rest."""
        for axis, value in (("tp", tp), ("pp", pp), ("cp", cp)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{axis} must be a positive integer, got {value!r}")
        if world_size % tp:
            raise ValueError(f"world size {world_size} is not divisible by tp {tp}; choose a tp that divides it")
        if world_size % (tp * pp * cp):
            raise ValueError(
                f"world size {world_size} is not divisible by tp {tp} x pp {pp} x cp {cp} = {tp * pp * cp}; choose "
                "axes whose product divides it"
            )
        return cls(dp_shard=world_size // (tp * pp * cp), tp=tp, pp=pp, cp=cp)

    def check_world(self, world_size: int) -> None:
        if world_size != self.world_size:
            raise ValueError(
                f"layout {self.describe()} needs {self.world_size} ranks, the run has {world_size}; make "
                f"{' x '.join(name.split()[0] for name in self._named_axes())} equal the world size"
            )

    def check_card(self, card) -> None:
        """The model card can be split ``tp`` ways: whole query and key/value heads on every rank."""
        if self.tp == 1:
            return
        heads = {"n_head": card.n_head, "n_kv_head": getattr(card, "n_kv_head", card.n_head)}
        for key, count in heads.items():
            if count % self.tp:
                raise ValueError(
                    f"layout tp {self.tp}: model card {card.name!r} has {key} {count}, not divisible by tp; "
                    f"choose a tp that divides {count}"
                )

    def check_batch(self, batch_size: int) -> None:
        if batch_size % self.dp:
            ranks = f"dp_replicate {self.dp_replicate} x dp_shard {self.dp_shard}" if self.dp_replicate > 1 else f"dp_shard {self.dp_shard}"
            raise ValueError(
                f"batch {batch_size} is not divisible by {ranks}; each data-parallel rank needs an equal share"
            )

    def check_sequence(self, seq_len: int, *, load_balanced: bool = True) -> None:
        """Every context-parallel rank holds an equal share of the sequence: ``seq_len`` divisible by ``cp``, and by
        ``2 * cp`` for the load-balanced ring (each rank takes chunk ``r`` and chunk ``2 * cp - 1 - r``)."""
        if self.cp == 1:
            return
        chunks = 2 * self.cp if load_balanced else self.cp
        if seq_len % chunks:
            how = f"2 x cp = {chunks} (the load-balanced ring)" if load_balanced else f"cp {self.cp}"
            raise ValueError(
                f"layout cp {self.cp}: sequence {seq_len} is not divisible by {how}; choose a sequence that is a "
                f"multiple of {chunks} or another cp"
            )

    def check_stages(self, n_blocks: int, stages_per_rank: int = 1) -> None:
        """Every pipeline stage holds at least one block: ``pp * stages_per_rank <= n_blocks``."""
        stages = self.pp * stages_per_rank
        if stages > n_blocks:
            raise ValueError(
                f"layout pp {self.pp}: {stages} pipeline stages ({self.pp} ranks x {stages_per_rank} per rank) for "
                f"{n_blocks} blocks; use at most {n_blocks} stages (a smaller pp or fewer stages per rank)"
            )

    def check_stage_shards(self, seq_len: int, vocab: int) -> None:
        """Tensor parallel inside pipeline stages: stages send equal local sequence shards of the hidden states and
        the last returns equal vocabulary shards of the logits (the shapes torch's schedule is given), so ``seq_len``
        and ``vocab`` are divisible by ``tp``."""
        if self.pp == 1:
            return
        refusal = stage_shard_refusal(self.tp, seq_len // self.cp, vocab)  # (a cp rank's share of the sequence)
        if refusal is not None:
            raise ValueError(refusal)

    def describe(self) -> str:
        return " x ".join(self._named_axes())

    def _named_axes(self) -> list[str]:
        """``dp_shard`` and ``tp`` always (the 2D names), ``dp_replicate``, ``pp`` and ``cp`` when used."""
        return [f"{axis} {getattr(self, axis)}" for axis in AXES if axis in ("dp_shard", "tp") or getattr(self, axis) > 1]


SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
MULTI_STAGE_SCHEDULES = ("interleaved_1f1b",)  # the schedules that run more than one stage per rank


@dataclass(frozen=True)
class PipelineSchedule:
    """How the pipeline stages run: ``schedule`` (torch's ``ScheduleGPipe``, ``Schedule1F1B``,
    ``ScheduleInterleaved1F1B``), ``microbatches`` per step (of a data-parallel rank's batch) and the stages each
    rank holds (more than one only for the interleaved schedule; torch assigns them round-robin, stage ``s`` on
    pipeline rank ``s % pp``)."""

    schedule: str = "1f1b"
    microbatches: int = 1
    stages_per_rank: int = 1

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"pipeline schedule {self.schedule!r} is unknown; use one of {', '.join(SCHEDULES)}")
        for key in ("microbatches", "stages_per_rank"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"pipeline {key} must be a positive integer, got {value!r}")
        if self.stages_per_rank > 1 and self.schedule not in MULTI_STAGE_SCHEDULES:
            raise ValueError(
                f"pipeline schedule {self.schedule} runs one stage per rank, got stages_per_rank "
                f"{self.stages_per_rank}; use schedule {MULTI_STAGE_SCHEDULES[0]} or stages_per_rank 1"
            )

    def describe(self) -> str:
        """``1f1b over 4 microbatches``: how a report and a rank's record name the schedule."""
        return f"{self.schedule} over {self.microbatches} microbatches"

    def check(self, layout: Layout, *, batch_size: int, n_blocks: int) -> None:
        """The schedule fits the layout, the batch and the model: stages <= blocks, and ``check_batch``."""
        layout.check_stages(n_blocks, self.stages_per_rank)
        self.check_batch(layout, batch_size=batch_size)

    def check_batch(self, layout: Layout, *, batch_size: int) -> None:
        """The schedule fits the layout and the batch (what a scenario checks before its card is loaded):
        microbatches dividing a data-parallel rank's rows, as many as torch's 1F1B schedules need, whole rounds for
        the interleaved one."""
        rows = batch_size // layout.dp
        if rows % self.microbatches:
            ranks = (f"dp_replicate {layout.dp_replicate} x dp_shard {layout.dp_shard}" if layout.dp_replicate > 1
                     else f"dp_shard {layout.dp_shard}")
            raise ValueError(
                f"layout pp {layout.pp}: {self.microbatches} microbatches do not divide the batch of a data-parallel "
                f"rank ({rows} rows = batch {batch_size} / {ranks}); choose microbatches that divide {rows}"
            )
        stages = layout.pp * self.stages_per_rank
        if self.schedule == "1f1b" and self.microbatches < stages:
            raise ValueError(
                f"layout pp {layout.pp}: schedule 1f1b needs at least one microbatch per stage ({stages}), got "
                f"{self.microbatches}; use microbatches >= {stages}"
            )
        if self.schedule == "interleaved_1f1b" and self.microbatches % max(1, self.microbatches // layout.pp):
            raise ValueError(
                f"layout pp {layout.pp}: schedule interleaved_1f1b runs microbatches in rounds of pp; "
                f"{self.microbatches} microbatches are not a whole number of rounds; use a multiple of {layout.pp}"
            )


def stage_shard_refusal(tp: int, seq_len: int, vocab: int) -> str | None:
    """Why ``tp`` cannot run inside pipeline stages at ``seq_len`` and ``vocab`` (stages send equal sequence shards
    of the hidden states, the last returns equal vocabulary shards of the logits), or None when it can."""
    if tp == 1:
        return None
    for what, size, why in (("sequence", seq_len, "stages send equal sequence shards of the hidden states"),
                            ("vocabulary", vocab, "the last stage returns equal vocabulary shards of the logits")):
        if size % tp:
            return (f"layout tp {tp} inside pipeline stages: {what} {size} is not divisible by tp ({why}); "
                    f"choose a tp that divides {size}")
    return None


def context_composed(layout: Layout, precision: str) -> bool:
    """A cp layout the fake-rank engine simulates (``simulate.fake_ranks``: cp with FSDP or tensor parallel, or in
    mixed precision); cp alone in pure precision is simulated on meta with the CUDA flash op's ring
    (``simulate.context_parallel``, labelled modelled)."""
    return layout.cp > 1 and (layout.dp_shard > 1 or layout.tp > 1 or precision == "mixed")
