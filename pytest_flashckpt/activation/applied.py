"""What ``apply_ac`` did, for reports: ``AppliedActivation`` (every strategy), ``AppliedBudget`` (the budget
strategy's, with its per-shape plans)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_flashckpt.activation.budget.planner import BudgetPlanner, ShapePlan


@dataclass
class AppliedActivation:
    """The strategy, the blocks whose forward it runs (``BlockForward``), and (selective_op) the save list and its
    matches in the most recent training forward (listed op name -> times it ran there; with the default list
    this includes the projections of ``DEFAULT_RECOMPUTE_ROLES``, which are listed but recomputed)."""

    strategy: str
    blocks: tuple[int, ...] = ()
    save_ops: tuple[str, ...] = ()
    matched_ops: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        """One line for reports: ``selective_op on blocks 0-3 (saving 7 ops; matched aten.addmm.default x16)``."""
        if self.strategy == "none":
            return "none (every activation kept)"
        text = f"{self.strategy} on blocks {_ranges(self.blocks)}"
        if self.save_ops:
            matched = ", ".join(f"{name} x{count}" for name, count in sorted(self.matched_ops.items()))
            text += f" (saving {len(self.save_ops)} ops" + (f"; matched {matched})" if matched else ")")
        return text

    def to_dict(self) -> dict:
        return {
            "strategy": self.strategy,
            "blocks": list(self.blocks),
            "save_ops": list(self.save_ops),
            "matched_ops": dict(self.matched_ops),
        }


@dataclass
class AppliedBudget(AppliedActivation):
    """The budget strategy's record: the planner (its spec) and one plan per input shape seen so far."""

    planner: BudgetPlanner = field(kw_only=True)

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


def _ranges(indices: tuple[int, ...]) -> str:
    """(0, 1, 2, 3) -> '0-3'; (0, 2) -> '0, 2'."""
    if len(indices) > 2 and indices == tuple(range(indices[0], indices[-1] + 1)):
        return f"{indices[0]}-{indices[-1]}"
    return ", ".join(map(str, indices))
