"""Activation checkpointing strategies applied to a model in place: ``apply_ac(model, config)``.

Every strategy is a plan: one ``BlockOption`` per block (``options``: keep, full recompute, save by role, save
listed ops, offload), chosen by ``plan.plan_for`` (``none``, ``full``, ``every_k``, ``selective_op``, ``offload``;
``budget``: the planner's choice per input shape, ``budget/``), and run by one wrapper (``wrapper.BlockForward``)
in place of the block's ``forward``, with whatever positional and keyword arguments the block takes. No wrapper
module is inserted, so parameter names (``blocks.<i>.*``, which the save strategies rely on) are exactly those of
the plain model. Recomputation runs under ``torch.utils.checkpoint`` (non-reentrant, RNG state preserved, so it
reproduces dropout masks bit for bit); what a partly recomputed block saves is one role policy's decision
(``policy.RolePolicy``), from the op (``ops``, the op table) and the block's anatomy (``models.anatomy``).

The budget planner measures the model's real training step: on a model that does not take ``model(tokens, targets)
-> loss``, the user gives it (``step``: ``loss=`` a function of the model's output, or ``step=`` the whole step; a
user-built transformers model defaults to next-token cross-entropy of its logits).

Modules, bottom to top: ``ops``, ``options``, ``step`` > ``policy``, ``blocks`` > ``wrapper`` > ``budget/`` (``model`` >
``solver``, ``costs`` > ``planner``) > ``plan`` > ``applied`` > ``apply``; ``flops`` and ``analytic`` (FLOP counting,
the analytic activation-memory model of our GPT) stand beside them.
"""

from pytest_flashckpt.activation.applied import AppliedActivation, AppliedBudget
from pytest_flashckpt.activation.apply import apply_ac, apply_budget
from pytest_flashckpt.activation.blocks import resolve_blocks
from pytest_flashckpt.activation.ops import DEFAULT_SAVE_OPS
from pytest_flashckpt.activation.options import BlockOption
from pytest_flashckpt.activation.plan import STRATEGIES, StrategyUnavailable, plan_for
from pytest_flashckpt.activation.step import StepTrainer, TrainingStep, next_token_loss, training_step

__all__ = [
    "DEFAULT_SAVE_OPS", "STRATEGIES", "AppliedActivation", "AppliedBudget", "BlockOption", "StrategyUnavailable",
    "StepTrainer", "TrainingStep", "apply_ac", "apply_budget", "next_token_loss", "plan_for", "resolve_blocks", "training_step",
]
