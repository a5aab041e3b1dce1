"""The ``budget`` activation strategy's planner: per block, keep / save by role / recompute (/ offload on a GPU),
chosen per input shape to fit a stated memory budget with the least recomputation. ``model`` holds the data
(costs, plans), ``costs`` measures, ``solver`` chooses, ``planner`` plans per shape; ``activation.apply`` runs the
plan (``apply_ac`` with strategy ``budget``, or ``activation.apply_budget``)."""

from pytest_flashckpt.activation.budget.costs import MeasuredCosts
from pytest_flashckpt.activation.budget.model import BudgetTooSmall, CostSource, Plan, PlanCosts
from pytest_flashckpt.activation.budget.planner import BudgetPlanner, ShapePlan
from pytest_flashckpt.activation.budget.solver import min_peak, solve
from pytest_flashckpt.activation.options import BlockOption, default_options
from pytest_flashckpt.config.budget import BudgetSpec, format_bytes

__all__ = [
    "BlockOption", "BudgetPlanner", "BudgetSpec", "BudgetTooSmall", "CostSource", "MeasuredCosts", "Plan", "PlanCosts",
    "ShapePlan", "default_options", "format_bytes", "min_peak", "solve",
]
