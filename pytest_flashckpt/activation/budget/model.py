"""The budget planner's data: what each block option costs at one input shape (``PlanCosts``), where costs come
from (``CostSource``), and a chosen plan (``Plan``). Pure data that the cost sources (``costs``, and
``simulate.costs``), the solver and the planner all read; it imports nothing of theirs.

``PlanCosts`` describes one input shape. Per block ``i`` and option ``o``:

- ``kept[i][o]``: bytes the block's forward leaves alive (its saved tensors and its output, which the next block
  keeps as its input): the live-bytes rise from the block's forward pre-hook to its forward hook;
- ``reach[i][o]``: the highest live bytes while block ``i`` runs forward or backward (its backward segment
  runs from the gradient of its output to the gradient of the block below's output, the last one to the end of
  the step: embeddings' backward and the optimizer step), *minus* what the blocks below keep. The head (final
  LayerNorm, logits, loss and their backward) is folded into the top block's ``reach``;
- ``flops`` / ``pointwise``: matmul FLOPs and pointwise output elements counted in those segments, minus the
  same count with no checkpointing: the recomputation the option adds;
- ``transfer`` (offload only; empty when no option offloads): bytes the option moves between device and host
  (each saved tensor out in the forward and back in the backward), priced by ``transfer_weight``.

A plan's peak is then ``max(before, max_i(sum(kept[j][o_j] for j < i) + reach[i][o_i]))`` (``before``: the
embeddings' forward). This is additive by construction: the blocks below a block are the only plan-dependent
memory alive while it runs. ``tests/activation/test_budget.py`` checks it against the probe on mixed plans.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Protocol

from pytest_flashckpt.activation.options import NONE, BlockOption


@dataclass
class PlanCosts:
    """Measured (or simulated) costs of every block option at one input shape (see the module docstring)."""

    batch_size: int
    seq_len: int
    options: tuple[BlockOption, ...]
    kept: list[list[int]]  # [block][option] bytes
    reach: list[list[int]]  # [block][option] bytes
    flops: list[list[int]]  # [block][option] extra matmul FLOPs
    pointwise: list[list[int]]  # [block][option] extra pointwise elements
    before: int  # peak before the first block (embeddings' forward), bytes
    measured_peaks: dict[str, int] = field(default_factory=dict)  # option name -> measured uniform-plan peak
    pointwise_weight: float = 0.0  # FLOP-equivalents of one recomputed pointwise element (fixed: ``costs.pointwise_weight_for``)
    transfer: list[list[int]] = field(default_factory=list)  # [block][option] bytes moved to host and back
    transfer_weight: float = 0.0  # FLOP-equivalents of one byte moved between device and host
    source: str = "measured"  # measured | simulated
    seconds: float = 0.0  # time spent measuring (or simulating)
    excluded: dict[str, str] = field(default_factory=dict)  # option name -> why the source does not offer it
    notes: tuple[str, ...] = ()  # what the source could not do as measured (e.g. no pointwise weight)

    @property
    def n_blocks(self) -> int:
        return len(self.kept)

    def option_index(self, option: BlockOption) -> int:
        return self.options.index(option)

    def cost(self, i: int, o: int) -> float:
        """The objective: recomputed FLOPs plus pointwise elements and offloaded bytes at their weights (the pointwise
        one a fixed model, so the same costs give the same plan on every run)."""
        moved = self.transfer_weight * self.transfer[i][o] if self.transfer else 0.0
        return self.flops[i][o] + self.pointwise_weight * self.pointwise[i][o] + moved

    def predict_peak(self, plan: Iterable[int]) -> int:
        """Predicted whole-step peak (bytes) of a plan given as option indices per block."""
        peak, below = self.before, 0
        for i, o in enumerate(plan):
            peak = max(peak, below + self.reach[i][o])
            below += self.kept[i][o]
        return peak

    def plan_flops(self, plan: Iterable[int]) -> int:
        return sum(self.flops[i][o] for i, o in enumerate(plan))

    def none_peak(self) -> int:
        return self.predict_peak([self.option_index(NONE)] * self.n_blocks)


class CostSource(Protocol):
    """Supplies ``PlanCosts`` for an input shape (measured here; simulated on ``meta`` for large cards)."""

    def costs(self, batch_size: int, seq_len: int) -> PlanCosts: ...


class BudgetTooSmall(ValueError):
    """No plan fits: ``minimum`` is the smallest achievable peak (bytes)."""

    def __init__(self, message: str, minimum: int) -> None:
        super().__init__(message)
        self.minimum = minimum


@dataclass(frozen=True)
class Plan:
    """Option index per block, the predicted peak (bytes) and recompute cost, and how it was found."""

    choice: tuple[int, ...]
    predicted_peak: int
    cost: float
    flops: int
    budget: int
    exact: bool
    seconds: float  # wall time of the solve
    states: int  # largest frontier seen
    cpu_seconds: float = 0.0  # process CPU time of the solve (what the algorithm costs on a busy machine)

    def names(self, costs: PlanCosts) -> tuple[str, ...]:
        return tuple(costs.options[o].name for o in self.choice)

    def options(self, costs: PlanCosts) -> list[BlockOption]:
        """The chosen option of each block."""
        return [costs.options[o] for o in self.choice]
