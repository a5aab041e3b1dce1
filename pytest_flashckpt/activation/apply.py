"""``apply_ac(model, config)``: an activation strategy applied to a model in place, through one path.

The blocks are the model's anatomy's (``activation.blocks``) or, for any other ``nn.Module``, the ones passed as
``blocks=``; the strategy's plan (``activation.plan.plan_for``: one ``BlockOption`` per block) is installed as
``BlockForward`` wrappers (``activation.wrapper``) on the blocks whose option is not ``none``. Two strategies also
drive their wrappers from hooks on the model: ``selective_op`` counts its listed ops per training forward and
fails a list that matched nothing; ``budget`` wraps every block and sets each block's option from the plan for the
input's (batch, seq) before each forward, planning a shape the first time it is seen.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn as nn

from pytest_flashckpt.activation.applied import AppliedActivation, AppliedBudget
from pytest_flashckpt.activation.blocks import resolve_blocks
from pytest_flashckpt.activation.budget.costs import MeasuredCosts
from pytest_flashckpt.activation.budget.model import CostSource
from pytest_flashckpt.activation.budget.planner import BudgetPlanner
from pytest_flashckpt.activation.options import NONE
from pytest_flashckpt.activation.plan import StrategyUnavailable, plan_for
from pytest_flashckpt.activation.policy import OpMatches
from pytest_flashckpt.activation.step import LossFn, StepFn, training_step
from pytest_flashckpt.activation.wrapper import install_block_forwards, is_wrapped
from pytest_flashckpt.config.budget import BudgetSpec
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.models.anatomy import ModelAnatomy


def apply_ac(
    model: nn.Module,
    config: ActivationConfig,
    shape: tuple[int, int] | None = None,
    source: CostSource | None = None,
    blocks: nn.ModuleList | nn.ModuleDict | Iterable[nn.Module] | str | None = None,
    *,
    step: StepFn | None = None,
    loss: LossFn | None = None,
    vocab_size: int | None = None,
) -> AppliedActivation:
    """Apply ``config.strategy`` to the model's blocks in place and return what was applied.

    ``blocks``: the blocks of a model without an anatomy (any ``nn.Module``: a ModuleList, the modules, or a
    dotted path to them); each block may take any arguments. Without it the anatomy's blocks are used, each
    checked against the anatomy (``check_block``: a ValueError naming the block and the modules that do not match).

    ``shape`` (batch, seq): the ``budget`` strategy plans that input shape now, so a budget below the smallest
    achievable peak is an error (``BudgetTooSmall``, a ValueError naming the minimum) before training starts;
    other shapes are planned at their first forward. ``source``: the budget planner's ``CostSource`` (default:
    costs measured on a private CPU copy; a GPU run passes simulated costs, ``simulate.costs.SimulatedCosts``).
    Other strategies ignore both.

    ``step`` / ``loss`` / ``vocab_size`` (``budget`` only, with the default source): the training step the planner
    measures on a model that does not take ``model(tokens, targets) -> loss`` (``activation.step``: a loss of the
    model's output, or the whole step; a user-built transformers model defaults to next-token cross-entropy).

    Raises ValueError for a configuration that cannot fit this model (k outside 1..the number of blocks, unknown save op),
    StrategyUnavailable for a strategy this device cannot run (offload without a GPU), and RuntimeError if the
    model already has a strategy applied.
    """
    found, anatomy = resolve_blocks(model, blocks)
    if any(is_wrapped(block) for block in found):
        raise RuntimeError("an activation strategy is already applied to this model; build a fresh model instead")
    device = next(model.parameters()).device
    given = [name for name, value in (("step", step), ("loss", loss), ("vocab_size", vocab_size)) if value is not None]
    if given and (config.strategy != "budget" or source is not None):
        why = f"strategy {config.strategy!r} measures nothing" if config.strategy != "budget" else "source= measures its own steps"
        raise ValueError(f"apply_ac: {', '.join(given)}= tell the budget planner's measured source how to run a step, but "
                         f"{why}; drop {', '.join(given)}=")
    if config.strategy == "budget":
        if source is None and device.type == "cpu":
            source = MeasuredCosts.shared(model, found, anatomy, training_step(model, step, loss, vocab_size))
        return _apply_budget(model, config, found, anatomy, device, shape, source)
    options = plan_for(config, len(found), has_anatomy=anatomy is not None, backend=getattr(model, "backend", None),
                       device_type=device.type)
    wrapped = [i for i, option in enumerate(options) if option != NONE]
    matches = OpMatches() if config.strategy == "selective_op" else None
    install_block_forwards(model, [found[i] for i in wrapped], anatomy, [options[i] for i in wrapped], matches)
    save_ops = next((option.ops for option in options if option.kind == "by_op"), ())
    applied = AppliedActivation(config.strategy, tuple(wrapped), save_ops=save_ops)
    if matches is not None:
        _count_matches(model, matches, applied)
    return applied


def apply_budget(
    model: nn.Module, budget: str | int | float, shape: tuple[int, int] | None = None, source: CostSource | None = None,
    blocks: nn.ModuleList | nn.ModuleDict | Iterable[nn.Module] | str | None = None, *, step: StepFn | None = None,
    loss: LossFn | None = None, vocab_size: int | None = None,
) -> AppliedBudget:
    """``apply_ac`` with strategy ``budget``: the model's blocks under per-shape plans that fit ``budget`` (a size,
    a fraction of the no-checkpointing peak, ``"min"`` or ``"min + 30%"``); ``step`` / ``loss``: how the planner
    runs the model's training step (``activation.step``)."""
    applied = apply_ac(model, ActivationConfig(strategy="budget", budget=budget), shape, source, blocks,
                       step=step, loss=loss, vocab_size=vocab_size)
    assert isinstance(applied, AppliedBudget)
    return applied


def _apply_budget(model: nn.Module, config: ActivationConfig, blocks: list[nn.Module], anatomy: ModelAnatomy | None,
                  device: torch.device, shape: tuple[int, int] | None, source: CostSource | None) -> AppliedBudget:
    """Every block wrapped and switchable; a forward pre-hook on the model sets each block's option from the plan
    for the input's (batch, seq). ``shape`` is planned now."""
    if source is None:  # apply_ac measures on a cpu; any other device needs a source
        raise StrategyUnavailable(
            f"budget plans from costs measured with the exact cpu probe; a {device.type.upper()} run needs a cost "
            "source: pass source=SimulatedCosts(...) (pytest_flashckpt.simulate.costs; the runner does)"
        )
    planner = BudgetPlanner(BudgetSpec.parse(config.budget), source)
    forwards = install_block_forwards(model, blocks, anatomy, [NONE] * len(blocks), switchable=True)
    applied = AppliedBudget("budget", tuple(range(len(forwards))), planner=planner)

    def plan_shape(batch_size: int, seq_len: int) -> None:
        options = plan_for(config, len(forwards), has_anatomy=anatomy is not None, device_type=device.type,
                           planner=planner, shape=(batch_size, seq_len))
        for forward, option in zip(forwards, options):
            forward.option = option

    def before(_module, args, kwargs) -> None:
        plan_shape(*input_shape(model, args, kwargs))

    model.register_forward_pre_hook(before, with_kwargs=True)
    if shape is not None:
        plan_shape(*shape)
    return applied


def input_shape(model: nn.Module, args: tuple, kwargs: dict) -> tuple[int, int]:
    """(batch, seq) of a model call: the first tensor of two or more dimensions among its positional, then its
    keyword arguments (``model(tokens)``, ``model(input_ids=tokens)``)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() >= 2:
            return int(value.shape[0]), int(value.shape[1])
    raise ValueError(f"budget: a {type(model).__name__} was called without a (batch, seq) tensor argument, so the plan "
                     "for its input shape is unknown; call the model on the tokens (model(tokens) or model(input_ids=...))")


def _count_matches(model: nn.Module, matches: OpMatches, applied: AppliedActivation) -> None:
    """Hooks on the model reset the match counts before each forward and check them after a forward that builds
    a graph (a step), recording them on ``applied``."""

    def before(_module, _args) -> None:
        matches.reset()

    def after(_module, _args, _output) -> None:
        if not torch.is_grad_enabled():
            return
        applied.matched_ops = dict(matches.matched)
        matches.check(applied.save_ops)

    model.register_forward_pre_hook(before)
    model.register_forward_hook(after)
