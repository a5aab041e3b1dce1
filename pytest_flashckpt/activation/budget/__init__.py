"""The ``budget`` activation strategy: per block, keep / save some ops / recompute, chosen per input shape to fit
a stated memory budget with the least recomputation. ``costs`` measures, ``solver`` chooses, ``runtime`` applies."""

from pytest_flashckpt.activation.budget.costs import CostSource, MeasuredCosts, PlanCosts
from pytest_flashckpt.activation.budget.options import BlockOption, default_options
from pytest_flashckpt.activation.budget.runtime import AppliedBudget, apply_budget
from pytest_flashckpt.config.budget import BudgetSpec, format_bytes
from pytest_flashckpt.activation.budget.solver import BudgetTooSmall, Plan, min_peak, solve

__all__ = [
    "AppliedBudget", "BlockOption", "BudgetSpec", "BudgetTooSmall", "CostSource", "MeasuredCosts", "Plan", "PlanCosts",
    "apply_budget", "default_options", "format_bytes", "min_peak", "solve",
]
