"""The ``budget`` strategy at run time: every block runs under a per-shape plan chosen before the forward.

``apply_budget`` replaces each block's ``forward`` with a ``PlannedForward`` (the option is switchable, the
module and its parameter names stay as they are) and registers a forward pre-hook on the model: it reads the
input's (batch, seq) and sets every block's option from the plan for that shape, planning (measure costs, solve)
the first time a shape is seen and caching the plan. Recomputation runs under ``torch.utils.checkpoint``
(non-reentrant, ``preserve_rng_state=True``), so any plan gives bitwise the loss and gradients of no
checkpointing, dropout included.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from pytest_flashckpt.activation.budget.costs import CostSource, PlanCosts
from pytest_flashckpt.activation.budget.options import NONE, BlockOption
from pytest_flashckpt.activation.budget.solver import BudgetTooSmall, Plan, min_peak, solve
from pytest_flashckpt.config.budget import BudgetSpec, format_bytes

def _save_on_host():
    return torch.autograd.graph.save_on_cpu(pin_memory=True)


class PlannedForward:
    """Stands in for a block's ``forward``; runs the original under ``option`` (switchable between steps).
    ``offload_context`` makes the offload option's saved-tensor hooks (``save_on_cpu``; the simulator swaps in
    hooks that do to device memory what ``save_on_cpu`` does, on ``meta`` where no data can be copied)."""

    def __init__(self, forward, option: BlockOption = NONE, offload_context=_save_on_host) -> None:
        self.forward = forward
        self.option = option
        self.strategy = "budget"
        self.offload_context = offload_context

    where: str = "block"  # the block's name in errors (install_planned_forwards sets it)

    def __call__(self, *args, **kwargs):
        kind = self.option.kind
        if kind == "none" or not torch.is_grad_enabled():
            return self.forward(*args, **kwargs)
        if kind == "offload":
            with self.offload_context():
                return self.forward(*args, **kwargs)
        if kind == "full":
            return checkpoint(self.forward, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)
        return checkpoint(self.forward, *args, use_reentrant=False, preserve_rng_state=True,
                          context_fn=self.option.context_fn(self.where), **kwargs)

    def __repr__(self) -> str:
        return f"PlannedForward({self.option.name})"


def install_planned_forwards(model: nn.Module, blocks=None, anatomy=None) -> list[PlannedForward]:
    """A ``PlannedForward`` on each block (the anatomy's, each checked, unless ``blocks`` is given) and the role
    hooks that let a selective option read which projection runs a matmul (``models.anatomy.role_hooks``)."""
    from pytest_flashckpt.activation import resolve_blocks
    from pytest_flashckpt.models.anatomy import role_hooks

    if blocks is None or anatomy is None:
        blocks, anatomy = resolve_blocks(model, blocks)
    names = {id(m): name for name, m in model.named_modules()}
    forwards = []
    for i, block in enumerate(blocks):
        forward = PlannedForward(block.forward)
        forward.where = names.get(id(block), f"block {i}")
        block.forward = forward
        forwards.append(forward)
        if anatomy is not None:
            role_hooks(block, anatomy)
    return forwards


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

    def plan_for(self, batch_size: int, seq_len: int) -> ShapePlan:
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


@dataclass
class AppliedBudget:
    """What ``apply_budget`` did (the ``AppliedActivation`` of the ``budget`` strategy): the spec and one plan
    per input shape seen so far."""

    planner: BudgetPlanner
    strategy: str = "budget"
    blocks: tuple[int, ...] = ()
    save_ops: tuple[str, ...] = ()
    matched_ops: dict[str, int] = field(default_factory=dict)

    @property
    def plans(self) -> dict[tuple[int, int], ShapePlan]:
        return self.planner.plans

    def describe(self) -> str:
        text = f"budget {self.planner.spec.describe()}"
        if not self.plans:
            return text + " (planned per input shape at the first forward)"
        return text + ": " + " | ".join(p.describe() for p in self.plans.values())

    def to_dict(self) -> dict:
        return {
            "strategy": "budget",
            "budget": self.planner.spec.describe(),
            "blocks": list(self.blocks),
            "plans": [p.to_dict() for p in self.plans.values()],
        }


def apply_budget(
    model: nn.Module, budget: str | int | float, shape: tuple[int, int] | None = None, source: CostSource | None = None,
    blocks=None, anatomy=None,
) -> AppliedBudget:
    """Put ``model``'s blocks (its anatomy's, or ``blocks``) under per-shape budget plans. ``shape`` plans that
    shape now (so a budget below the minimum is an error before anything runs); ``source`` defaults to measured
    costs on this device."""
    from pytest_flashckpt.activation.budget.costs import MeasuredCosts

    spec = BudgetSpec.parse(budget)
    planner = BudgetPlanner(spec, source if source is not None else MeasuredCosts.shared(model, blocks, anatomy))
    forwards = install_planned_forwards(model, blocks, anatomy)
    applied = AppliedBudget(planner, blocks=tuple(range(len(forwards))))

    def before(_module, args) -> None:
        idx = args[0]
        shape_plan = planner.plan_for(int(idx.shape[0]), int(idx.shape[1]))
        for forward, o in zip(forwards, shape_plan.plan.choice):
            forward.option = shape_plan.costs.options[o]

    model.register_forward_pre_hook(before)
    if shape is not None:
        planner.plan_for(*shape)
    return applied
