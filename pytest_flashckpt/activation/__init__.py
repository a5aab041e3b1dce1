"""Activation checkpointing strategies applied to a model in place: ``apply_ac(model, config)``.

The blocks are the model's anatomy's (``models.anatomy``: ``model.anatomy()`` or a registered discoverer; each
block is checked against it first) or, for any other ``nn.Module``, the ones passed as ``blocks=``. Each strategy
replaces the ``forward`` of the chosen blocks with a ``CheckpointedForward`` that runs the original forward, with
whatever positional and keyword arguments the block takes, under ``torch.utils.checkpoint`` (non-reentrant, RNG
state preserved, so recomputation reproduces dropout masks bit for bit) or under ``save_on_cpu``. No wrapper module
is inserted, so parameter names (``blocks.<i>.*``, which the save strategies rely on) are exactly those of the
plain model.

- ``none``: nothing changes (the reference).
- ``full``: every block is recomputed in the backward pass; only block inputs are kept.
- ``every_k``: blocks 0, k, 2k, ... are recomputed.
- ``selective_op``: every block under a selective-checkpoint policy that keeps matmul and attention outputs and
  recomputes pointwise ops (see ``selective``); the configured ops must match at least once per forward. The
  default list also recomputes the attention output projection (role ``o``, ``DEFAULT_RECOMPUTE_ROLES``; roles are
  read from the anatomy, so blocks given without one save every listed op), and attention with dropout is
  recomputed rather than saved (a saved random op would shift the RNG for the ops after it).
- ``offload``: every block's saved tensors go to pinned CPU memory (GPU runs only).
- ``budget``: per input shape, each block gets the option (keep, save some ops, recompute, offload on a GPU)
  that fits ``config.budget`` with the least recomputation, from measured costs (see ``activation.budget``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterable

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from pytest_flashckpt.activation.selective import DEFAULT_RECOMPUTE_ROLES, DEFAULT_SAVE_OPS, SavePolicy, default_save_ops
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.models.anatomy import ModelAnatomy, check_block, get_anatomy, get_blocks, role_hooks
from pytest_flashckpt.core.registry import ACTIVATION_STRATEGIES

__all__ = ["DEFAULT_SAVE_OPS", "AppliedActivation", "StrategyUnavailable", "apply_ac", "resolve_blocks"]

STRATEGIES = tuple(ACTIVATION_STRATEGIES)  # names and descriptions: pytest_flashckpt.core.registry


class StrategyUnavailable(RuntimeError):
    """The strategy cannot run on this device; ``reason`` is meant to be shown as a skip reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class AppliedActivation:
    """What ``apply_ac`` did: the strategy, which blocks it wraps, and (selective_op) the save list and its
    matches in the most recent training forward (listed op name -> times it ran there; with the default list
    this includes the attention output projections, which are listed but recomputed)."""

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


def _ranges(indices: tuple[int, ...]) -> str:
    """(0, 1, 2, 3) -> '0-3'; (0, 2) -> '0, 2'."""
    if len(indices) > 2 and indices == tuple(range(indices[0], indices[-1] + 1)):
        return f"{indices[0]}-{indices[-1]}"
    return ", ".join(map(str, indices))


class CheckpointedForward:
    """Stands in for a block's ``forward``: runs the original one, with the block's own arguments (any positional
    and keyword arguments: hidden states, rotary tables, masks), under a strategy's context."""

    def __init__(self, forward: Callable, strategy: str, context_fn: Callable | None = None) -> None:
        self.forward = forward
        self.strategy = strategy
        self.context_fn = context_fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.strategy == "offload":
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                return self.forward(*args, **kwargs)
        if self.context_fn is None:
            return checkpoint(self.forward, *args, use_reentrant=False, **kwargs)
        return checkpoint(self.forward, *args, use_reentrant=False, context_fn=self.context_fn, **kwargs)

    def __repr__(self) -> str:
        return f"CheckpointedForward({self.strategy})"


def resolve_blocks(
    model: nn.Module, blocks: nn.ModuleList | Iterable[nn.Module] | str | None = None
) -> tuple[list[nn.Module], ModelAnatomy | None]:
    """The blocks a strategy wraps and the anatomy that names their modules (None when ``blocks`` is given for a
    model without one). ``blocks``: None (the anatomy's, each checked with ``check_block``), a dotted submodule
    path (``"model.layers"``) or the block modules themselves."""
    anatomy: ModelAnatomy | None
    try:
        anatomy = get_anatomy(model)
    except ValueError:
        if blocks is None:
            raise
        anatomy = None
    if blocks is None:
        found = list(get_blocks(model, anatomy))
        names = [f"{anatomy.blocks}.{i}" for i in range(len(found))]
    else:
        if isinstance(blocks, str):
            blocks = model.get_submodule(blocks)
        found = list(blocks)
        if not found or not all(isinstance(b, nn.Module) for b in found):
            raise ValueError("apply_ac: blocks= must name a non-empty ModuleList (or a dotted path to one) of nn.Modules")
        by_id = {id(m): name for name, m in model.named_modules()}
        names = [by_id.get(id(b), f"blocks[{i}]") for i, b in enumerate(found)]
    if anatomy is not None:
        for name, block in zip(names, found):
            check_block(anatomy, block, where=name)
    return found, anatomy


def apply_ac(
    model: nn.Module,
    config: ActivationConfig,
    shape: tuple[int, int] | None = None,
    source=None,
    blocks: nn.ModuleList | Iterable[nn.Module] | str | None = None,
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

    Raises ValueError for a configuration that cannot fit this model (k outside 1..n_layer, unknown save op),
    StrategyUnavailable for a strategy this device cannot run (offload without a GPU), and RuntimeError if the
    model already has a strategy applied.
    """
    blocks, anatomy = resolve_blocks(model, blocks)
    n_layer = len(blocks)
    from pytest_flashckpt.activation.budget.runtime import PlannedForward

    if any(isinstance(block.__dict__.get("forward"), (CheckpointedForward, PlannedForward)) for block in blocks):
        raise RuntimeError("an activation strategy is already applied to this model; build a fresh model instead")
    strategy = config.strategy
    if strategy == "none":
        return AppliedActivation("none")
    if strategy == "full":
        return _wrap(blocks, range(n_layer), AppliedActivation("full"))
    if strategy == "every_k":
        if not 1 <= config.k <= n_layer:
            raise ValueError(
                f"every_k: k={config.k} is outside the valid range 1..n_layer ({n_layer}) for this {n_layer}-block model"
            )
        return _wrap(blocks, range(0, n_layer, config.k), AppliedActivation("every_k"))
    if strategy == "selective_op":
        return _apply_selective(model, config, blocks, anatomy)
    if strategy == "offload":
        device = next(model.parameters()).device
        if device.type != "cuda":
            raise StrategyUnavailable(
                f"offload moves activations from GPU to CPU memory; on a {device.type.upper()} run there is nothing to offload"
            )
        return _wrap(blocks, range(n_layer), AppliedActivation("offload"))
    if strategy == "budget":
        from pytest_flashckpt.activation.budget.runtime import apply_budget

        device = next(model.parameters()).device
        if device.type != "cpu" and source is None:
            raise StrategyUnavailable(
                f"budget plans from costs measured with the exact cpu probe; a {device.type.upper()} run needs a cost "
                "source: pass source=SimulatedCosts(...) (pytest_flashckpt.simulate.costs; the runner does)"
            )

        return apply_budget(model, config.budget, shape, source=source, blocks=blocks, anatomy=anatomy)  # type: ignore[return-value]  # same interface
    raise ValueError(f"unknown activation strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")


def _wrap(blocks, indices, applied: AppliedActivation, context_fn: Callable | None = None) -> AppliedActivation:
    """``context_fn``: None, or ``index -> checkpoint context_fn`` for block ``index``."""
    applied.blocks = tuple(indices)
    for i in applied.blocks:
        block = blocks[i]
        block.forward = CheckpointedForward(block.forward, applied.strategy, None if context_fn is None else context_fn(i))
    return applied


def _apply_selective(model: nn.Module, config: ActivationConfig, blocks: list, anatomy: ModelAnatomy | None) -> AppliedActivation:
    """Every block under the selective policy; hooks on the model reset the match counts before each forward and
    check them after a forward that builds a graph (a step), recording them on the returned record. With an
    anatomy, hooks on each block's projection modules tell the policy which role a matmul belongs to."""
    names = tuple(config.save_ops) if config.save_ops is not None else default_save_ops(getattr(model, "backend", None))
    if not names:
        raise ValueError("selective_op: save_ops is empty, so nothing would be saved; list ops or leave it unset")
    recompute = DEFAULT_RECOMPUTE_ROLES if config.save_ops is None and anatomy is not None else ()
    policy = SavePolicy(names, recompute, strict=anatomy is not None)  # resolves every name: ValueError for one that does not exist
    applied = AppliedActivation("selective_op", save_ops=names)
    if anatomy is not None:
        for block in blocks:
            role_hooks(block, anatomy)

    def before(_module, _args) -> None:
        policy.reset()

    def after(_module, _args, _output) -> None:
        if not torch.is_grad_enabled():
            return
        applied.matched_ops = dict(policy.matched)
        policy.check_matched()

    model.register_forward_pre_hook(before)
    model.register_forward_hook(after)
    where = _block_names(model, blocks)
    return _wrap(blocks, range(len(blocks)), applied, lambda i: partial(policy.context_fn, where[i]))


def _block_names(model: nn.Module, blocks: list) -> list[str]:
    """Each block's dotted name in the model (``blocks.3``, ``model.layers.3``), for errors."""
    by_id = {id(m): name for name, m in model.named_modules()}
    return [by_id.get(id(b), f"block {i}") for i, b in enumerate(blocks)]
