"""The ``budget`` strategy's planner: per input shape, costs from a ``CostSource``, the budget resolved against
them, and the least-recomputation plan that fits (``solver.solve``), cached per (batch, seq).

A budget below the smallest achievable peak is a ``BudgetTooSmall`` naming the key, the minimum and the shape.
``activation.plan.plan_for`` reads a shape's options from here; ``activation.apply`` sets them on the blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_flashckpt.activation.budget.model import BudgetTooSmall, CostSource, Plan, PlanCosts
from pytest_flashckpt.activation.budget.solver import min_peak, solve
from pytest_flashckpt.activation.options import BlockOption
from pytest_flashckpt.config.budget import BudgetSpec, format_bytes


@dataclass
class ShapePlan:
    """The plan for one (batch, seq): chosen options, the budget in bytes, minimum and no-checkpointing peaks."""

    batch_size: int
    seq_len: int
    options: tuple[str, ...]
    plan: Plan
    budget_bytes: int
    min_peak: int
    none_peak: int
    costs: PlanCosts

    def block_options(self) -> list[BlockOption]:
        """The chosen option of each block."""
        return self.plan.options(self.costs)

    def describe(self) -> str:
        groups: list[tuple[str, list[int]]] = []
        for i, name in enumerate(self.options):
            if groups and groups[-1][0] == name:
                groups[-1][1].append(i)
            else:
                groups.append((name, [i]))
        blocks = "; ".join(f"{_span(idx)} {name}" for name, idx in groups)
        return (
            f"b{self.batch_size}xs{self.seq_len}: {blocks} (predicted peak {self.plan.predicted_peak / 2**20:,.1f} MiB "
            f"of budget {self.budget_bytes / 2**20:,.1f} MiB; min {self.min_peak / 2**20:,.1f}, none {self.none_peak / 2**20:,.1f} MiB; "
            f"+{self.plan.flops / 1e9:.3f} GFLOP recomputed; {'exact' if self.plan.exact else 'fallback'} solve "
            f"{self.plan.seconds * 1e3:.1f} ms)"
        )

    def to_dict(self) -> dict:
        return {
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "blocks": list(self.options),
            "budget_bytes": self.budget_bytes,
            "predicted_peak_bytes": self.plan.predicted_peak,
            "min_peak_bytes": self.min_peak,
            "none_peak_bytes": self.none_peak,
            "recompute_flops": self.plan.flops,
            "exact": self.plan.exact,
            "solve_s": self.plan.seconds,
            "solve_cpu_s": self.plan.cpu_seconds,
            "measure_s": self.costs.seconds,
        }


def _span(indices: list[int]) -> str:
    return f"block {indices[0]}" if len(indices) == 1 else f"blocks {indices[0]}-{indices[-1]}"


class BudgetPlanner:
    """Plans per shape from a ``CostSource`` and a ``BudgetSpec``; caches one ``ShapePlan`` per (batch, seq)."""

    def __init__(self, spec: BudgetSpec, source: CostSource, where: str = "activation.budget") -> None:
        self.spec = spec
        self.source = source
        self.where = where
        self.plans: dict[tuple[int, int], ShapePlan] = {}

    def plan(self, batch_size: int, seq_len: int) -> ShapePlan:
        """The plan for (batch, seq): planned (costs, minimum, budget, solve) the first time the shape is seen."""
        key = (batch_size, seq_len)
        if key not in self.plans:
            costs = self.source.costs(batch_size, seq_len)
            lowest = min_peak(costs)
            budget = self.spec.resolve(costs, lowest.predicted_peak)
            try:
                plan = solve(costs, budget)
            except BudgetTooSmall as exc:
                stated = self.spec.describe() + ("" if self.spec.kind == "bytes" else f" = {format_bytes(budget)}")
                raise BudgetTooSmall(
                    f"{self.where}: {stated} is below the smallest achievable "
                    f"peak {format_bytes(exc.minimum)} at batch {batch_size} x seq {seq_len} (every block planned for the "
                    f"least memory); raise {self.where} to at least {format_bytes(exc.minimum)}, or use a smaller batch "
                    "or sequence",
                    exc.minimum,
                ) from None
            names = plan.names(costs)
            self.plans[key] = ShapePlan(batch_size, seq_len, names, plan, budget, lowest.predicted_peak, costs.none_peak(), costs)
        return self.plans[key]
