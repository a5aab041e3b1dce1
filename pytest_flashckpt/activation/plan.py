"""Every activation strategy as a plan: ``plan_for`` gives one ``BlockOption`` per block.

- ``none``: every block ``none`` (keeps everything; the reference);
- ``full``: every block ``full`` (only block inputs are kept);
- ``every_k``: blocks 0, k, 2k, ... ``full``, the others ``none``;
- ``selective_op``: every block ``by_op`` with the configured save list (default: matmuls and attention kernels,
  ``ops.default_save_ops``, with the matmuls of ``DEFAULT_RECOMPUTE_ROLES`` (``o`` and ``down``) recomputed;
  roles are read from the anatomy, so blocks given without one save every listed op);
- ``offload``: every block ``offload`` (GPU runs only);
- ``budget``: per input shape, the planner's choice (``budget.planner.BudgetPlanner``: keep, save by role,
  recompute, offload on a GPU; the least recomputation that fits ``config.budget``).

Each strategy's plan is a function here, named by its row in ``core.registry.ACTIVATION_STRATEGIES`` (a new
strategy's plan may live in its own module). Bad configurations are errors here, before anything runs: k outside 1..n_blocks, an empty or unknown save list
(ValueError), a strategy this device cannot run (``StrategyUnavailable``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from pytest_flashckpt.activation import options as _options
from pytest_flashckpt.activation.budget.planner import BudgetPlanner
from pytest_flashckpt.activation.ops import default_save_ops
from pytest_flashckpt.activation.options import FULL, NONE, OFFLOAD, BlockOption
from pytest_flashckpt.activation.policy import listed_ops
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.core.registry import ACTIVATION_STRATEGIES

STRATEGIES = tuple(ACTIVATION_STRATEGIES)  # names and descriptions: pytest_flashckpt.core.registry


class StrategyUnavailable(RuntimeError):
    """The strategy cannot run on this device; ``reason`` is meant to be shown as a skip reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class PlanContext:
    """What a strategy's plan may read besides its config: see ``plan_for``."""

    has_anatomy: bool = True
    backend: str | None = None
    device_type: str = "cpu"
    planner: BudgetPlanner | None = None
    shape: tuple[int, int] | None = None


Plan = Callable[[ActivationConfig, int, PlanContext], "list[BlockOption]"]


def plan_for(
    config: ActivationConfig, n_blocks: int, *, has_anatomy: bool = True, backend: str | None = None,
    device_type: str = "cpu", planner: BudgetPlanner | None = None, shape: tuple[int, int] | None = None,
) -> list[BlockOption]:
    """The option of each of ``n_blocks`` blocks under ``config.strategy``: the registered strategy's plan
    function (``core.registry.ActivationStrategySpec.plan``; see the module docstring).

    ``has_anatomy``: the blocks' roles can be read (False for blocks given without an anatomy); ``backend``: the
    attention backend (``flash_attn`` imports flash-attn so selective_op's default finds its ops); ``device_type``:
    where the model runs; ``planner`` and ``shape`` (batch, seq): the budget strategy's planner and the input shape
    to plan (``BudgetTooSmall`` if its budget is below the smallest achievable peak there)."""
    spec = ACTIVATION_STRATEGIES.get(config.strategy)
    if spec is None:
        raise ValueError(f"unknown activation strategy {config.strategy!r}; valid: {', '.join(ACTIVATION_STRATEGIES)}")
    context = PlanContext(has_anatomy, backend, device_type, planner, shape)
    options = strategy_plan(spec.plan)(config, n_blocks, context)
    if len(options) != n_blocks:
        raise ValueError(f"{config.strategy}: its plan has {len(options)} block options for {n_blocks} blocks")
    return options


def strategy_plan(target: str) -> Plan:
    """The plan function a registry row names (``"module:function"``)."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def keep_every_block(config: ActivationConfig, n_blocks: int, context: PlanContext) -> list[BlockOption]:
    return [NONE] * n_blocks


def recompute_every_block(config: ActivationConfig, n_blocks: int, context: PlanContext) -> list[BlockOption]:
    return [FULL] * n_blocks


def recompute_every_kth_block(config: ActivationConfig, n_blocks: int, context: PlanContext) -> list[BlockOption]:
    if not 1 <= config.k <= n_blocks:
        raise ValueError(
            f"every_k: k={config.k} is outside the valid range 1..{n_blocks} (the model's blocks) for this {n_blocks}-block model"
        )
    return [FULL if i % config.k == 0 else NONE for i in range(n_blocks)]


def selective_op_blocks(config: ActivationConfig, n_blocks: int, context: PlanContext) -> list[BlockOption]:
    return [selective_op_option(config, context.has_anatomy, context.backend)] * n_blocks


def offload_every_block(config: ActivationConfig, n_blocks: int, context: PlanContext) -> list[BlockOption]:
    if context.device_type != "cuda":
        raise StrategyUnavailable(
            f"offload moves activations from GPU to CPU memory; on a {context.device_type.upper()} run there is nothing to offload"
        )
    return [OFFLOAD] * n_blocks


def planned_for_budget(config: ActivationConfig, n_blocks: int, context: PlanContext) -> list[BlockOption]:
    if context.planner is None or context.shape is None:
        raise ValueError("budget: the plan depends on the input shape; pass the planner and the (batch, seq) shape")
    options = context.planner.plan(*context.shape).block_options()
    if len(options) != n_blocks:
        raise ValueError(f"budget: the planner's costs have {len(options)} blocks, the model {n_blocks}")
    return options


def selective_op_option(config: ActivationConfig, has_anatomy: bool = True, backend: str | None = None) -> BlockOption:
    """``selective_op``'s block option: save the listed ops (``config.save_ops``, default ``default_save_ops``);
    with the default list and an anatomy, recompute the matmuls of ``DEFAULT_RECOMPUTE_ROLES``. Every name is
    resolved now (ValueError for one that does not exist)."""
    names = tuple(config.save_ops) if config.save_ops is not None else default_save_ops(backend)
    if not names:
        raise ValueError("selective_op: save_ops is empty, so nothing would be saved; list ops or leave it unset")
    listed_ops(names)
    recompute = _options.DEFAULT_RECOMPUTE_ROLES if config.save_ops is None and has_anatomy else ()
    return BlockOption("by_op", ops=names, recompute=tuple(recompute), strict=has_anatomy)
