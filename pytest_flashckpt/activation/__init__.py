"""Activation checkpointing strategies applied to a GPT in place: ``apply_ac(model, config)``.

Each strategy replaces the ``forward`` of the chosen blocks with a ``CheckpointedForward`` that runs the original
forward under ``torch.utils.checkpoint`` (non-reentrant, RNG state preserved, so recomputation reproduces dropout
masks bit for bit) or under ``save_on_cpu``. No wrapper module is inserted, so parameter names (``blocks.<i>.*``,
which the save strategies rely on) are exactly those of the plain model.

- ``none``: nothing changes (the reference).
- ``full``: every block is recomputed in the backward pass; only block inputs are kept.
- ``every_k``: blocks 0, k, 2k, ... are recomputed.
- ``selective_op``: every block under a selective-checkpoint policy that keeps matmul and attention outputs and
  recomputes pointwise ops (see ``selective``); the configured ops must match at least once per forward. The
  default list also recomputes the attention output projection (``DEFAULT_RECOMPUTE_LINEARS``), and attention
  with dropout is recomputed rather than saved (a saved random op would shift the RNG for the ops after it).
- ``offload``: every block's saved tensors go to pinned CPU memory (GPU runs only).
- ``budget``: per input shape, each block gets the option (keep, save some ops, recompute, offload on a GPU)
  that fits ``config.budget`` with the least recomputation, from measured costs (see ``activation.budget``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from pytest_flashckpt.activation.selective import DEFAULT_RECOMPUTE_LINEARS, DEFAULT_SAVE_OPS, SavePolicy, default_save_ops
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.registry import ACTIVATION_STRATEGIES

__all__ = ["DEFAULT_SAVE_OPS", "AppliedActivation", "StrategyUnavailable", "apply_ac"]

STRATEGIES = tuple(ACTIVATION_STRATEGIES)  # names and descriptions: pytest_flashckpt.registry


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
    """Stands in for a block's ``forward``: runs the original one under a strategy's context."""

    def __init__(self, forward: Callable, strategy: str, context_fn: Callable | None = None) -> None:
        self.forward = forward
        self.strategy = strategy
        self.context_fn = context_fn

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.strategy == "offload":
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                return self.forward(x)
        if self.context_fn is None:
            return checkpoint(self.forward, x, use_reentrant=False)
        return checkpoint(self.forward, x, use_reentrant=False, context_fn=self.context_fn)

    def __repr__(self) -> str:
        return f"CheckpointedForward({self.strategy})"


def apply_ac(
    model: nn.Module, config: ActivationConfig, shape: tuple[int, int] | None = None, source=None
) -> AppliedActivation:
    """Apply ``config.strategy`` to ``model.blocks`` in place and return what was applied.

    ``shape`` (batch, seq): the ``budget`` strategy plans that input shape now, so a budget below the smallest
    achievable peak is an error (``BudgetTooSmall``, a ValueError naming the minimum) before training starts;
    other shapes are planned at their first forward. ``source``: the budget planner's ``CostSource`` (default:
    costs measured on a private CPU copy; a GPU run passes simulated costs, ``simulate.costs.SimulatedCosts``).
    Other strategies ignore both.

    Raises ValueError for a configuration that cannot fit this model (k outside 1..n_layer, unknown save op),
    StrategyUnavailable for a strategy this device cannot run (offload without a GPU), and RuntimeError if the
    model already has a strategy applied.
    """
    blocks = model.blocks
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
        return _apply_selective(model, config)
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

        return apply_budget(model, config.budget, shape, source=source)  # type: ignore[return-value]  # same interface
    raise ValueError(f"unknown activation strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")


def _wrap(blocks: nn.ModuleList, indices, applied: AppliedActivation, context_fn: Callable | None = None) -> AppliedActivation:
    applied.blocks = tuple(indices)
    for i in applied.blocks:
        block = blocks[i]
        block.forward = CheckpointedForward(block.forward, applied.strategy, context_fn)
    return applied


def _apply_selective(model: nn.Module, config: ActivationConfig) -> AppliedActivation:
    """Every block under the selective policy; hooks on the model reset the match counts before each forward and
    check them after a forward that builds a graph (a step), recording them on the returned record."""
    names = tuple(config.save_ops) if config.save_ops is not None else default_save_ops(getattr(model, "backend", None))
    if not names:
        raise ValueError("selective_op: save_ops is empty, so nothing would be saved; list ops or leave it unset")
    policy = SavePolicy(names, DEFAULT_RECOMPUTE_LINEARS if config.save_ops is None else ())  # resolves every name: ValueError for one that does not exist
    applied = AppliedActivation("selective_op", save_ops=names)

    def before(_module, _args) -> None:
        policy.reset()

    def after(_module, _args, _output) -> None:
        if not torch.is_grad_enabled():
            return
        applied.matched_ops = dict(policy.matched)
        policy.check_matched()

    model.register_forward_pre_hook(before)
    model.register_forward_hook(after)
    return _wrap(model.blocks, range(len(model.blocks)), applied, policy.context_fn)
