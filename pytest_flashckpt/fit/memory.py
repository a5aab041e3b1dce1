"""A candidate's per-rank peak: one memory source per layout axis, then what the search adds on top.

``AXIS_SOURCES`` says, per axis of a layout, how its memory is known: ``dp_shard`` and ``tp`` are simulated by the
real engine under fake mode (``simulate.fake_ranks.simulate_rank``: torch's ``fully_shard`` and
``parallelize_module`` on a fake process group, the rank's live tensors phase by phase); ``dp_replicate`` (HSDP)
adds nothing to a rank (a replica holds the same shards: the rank is the ``dp_shard x tp`` rank with the same
microbatch); ``pp`` and ``cp`` have no source yet (their simulations, ``simulate/pipeline.py`` and
``simulate/context_parallel.py``, are another change): a candidate with them is refused with that reason. When they
land, their entry becomes the function that simulates a stage / a sequence shard.

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

from pytest_flashckpt.config.layout import Layout
from pytest_flashckpt.fit.candidates import COMPUTE_BYTES, Candidate
from pytest_flashckpt.simulate.fake_ranks import simulate_rank


@dataclass(frozen=True)
class RankInputs:
    """What one simulation of a rank depends on (the cache key)."""

    dp_shard: int
    tp: int
    batch_size: int  # the data-parallel group's microbatch: microbatch x dp_shard
    seq_len: int
    strategy: str
    k: int
    precision: str


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

    @property
    def source(self) -> str:
        return "simulated" + "".join(f" + {name} (modelled)" for name, nbytes in self.added.items() if nbytes)


def _simulated_axes(candidate: Candidate) -> str | None:
    return None


def _not_yet(axis: str, module: str) -> Callable[[Candidate], str | None]:
    def refuse(candidate: Candidate) -> str | None:
        if getattr(candidate, axis) > 1:
            return f"{axis} {getattr(candidate, axis)}: not searched yet (its simulation, {module}, is not on this branch)"
        return None
    return refuse


# axis -> a check that returns why a candidate's memory cannot be known on that axis (None: known, see the doc)
AXIS_SOURCES: dict[str, Callable[[Candidate], str | None]] = {
    "dp_shard": _simulated_axes,
    "tp": _simulated_axes,
    "dp_replicate": _simulated_axes,  # the dp_shard x tp rank itself
    "pp": _not_yet("pp", "simulate/pipeline.py"),
    "cp": _not_yet("cp", "simulate/context_parallel.py"),
}


def unknown_axis(candidate: Candidate) -> str | None:
    """Why no memory source covers ``candidate`` (None: every axis has one)."""
    return next((why for check in AXIS_SOURCES.values() if (why := check(candidate)) is not None), None)


def block_parameters(card) -> int:
    """The parameters outside the embedding and an untied head: what FSDP2 all-gathers block by block."""
    tied = getattr(card, "tie_word_embeddings", True)
    return card.num_params() - card.vocab_size * card.n_embd * (1 if tied else 2)


class RankMemoryModel:
    """Per-rank peaks of candidates of one card and sequence length, simulated once per distinct ``RankInputs``."""

    def __init__(self, card, seq_len: int, simulate: Callable[..., dict] = simulate_rank) -> None:
        self.card = card
        self.seq_len = seq_len
        self.simulate = simulate
        self.records: dict[RankInputs, dict] = {}

    def inputs(self, candidate: Candidate) -> RankInputs:
        return RankInputs(candidate.dp_shard, candidate.tp, candidate.microbatch * candidate.dp_shard, self.seq_len,
                          candidate.strategy, candidate.k, candidate.precision)

    def is_cached(self, candidate: Candidate) -> bool:
        return self.inputs(candidate) in self.records

    def record(self, candidate: Candidate) -> dict:
        """The simulated rank (cached); a ValueError with the engine's reason, cached too, for one it refuses."""
        key = self.inputs(candidate)
        if key not in self.records:
            try:
                self.records[key] = self.simulate(
                    self.card, Layout(dp_shard=key.dp_shard, tp=key.tp), batch_size=key.batch_size,
                    seq_len=key.seq_len, strategy=key.strategy, k=key.k, dtype=torch.bfloat16, precision=key.precision)
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
        added = {
            "accumulated gradients": gradients if candidate.accumulation > 1 else 0,
            "unsharded block parameters": self.unsharded_blocks(candidate) if not candidate.reshard_after_forward else 0,
        }
        fwd_bwd = record["fwd_bwd_peak_bytes"] + sum(added.values())
        return RankMemory(max(fwd_bwd, record["optimizer_peak_bytes"]), record["peak_bytes"], state, gradients,
                          added, sum(record.get(key, 0.0) for key in ("layout_s", "warm_step_s", "measured_step_s")))

    def unsharded_blocks(self, candidate: Candidate) -> int:
        held = block_parameters(self.card) // (candidate.tp * candidate.pp)
        return held * COMPUTE_BYTES * (candidate.dp_shard - 1) // candidate.dp_shard
