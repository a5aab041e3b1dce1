"""Every activation strategy as a plan: ``plan_for`` gives one ``BlockOption`` per block.

- ``none``: every block ``none`` (keeps everything; the reference);
- ``full``: every block ``full`` (only block inputs are kept);
- ``every_k``: blocks 0, k, 2k, ... ``full``, the others ``none``;
- ``selective_op``: every block ``by_op`` with the configured save list (default: matmuls and attention kernels,
  ``ops.default_save_ops``, with the attention output projection's matmul recomputed, ``DEFAULT_RECOMPUTE_ROLES``;
  roles are read from the anatomy, so blocks given without one save every listed op);
- ``offload``: every block ``offload`` (GPU runs only);
- ``budget``: per input shape, the planner's choice (``budget.planner.BudgetPlanner``: keep, save by role,
  recompute, offload on a GPU; the least recomputation that fits ``config.budget``).

Bad configurations are errors here, before anything runs: k outside 1..n_blocks, an empty or unknown save list
(ValueError), a strategy this device cannot run (``StrategyUnavailable``).
"""

from __future__ import annotations

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


def plan_for(
    config: ActivationConfig, n_blocks: int, *, has_anatomy: bool = True, backend: str | None = None,
    device_type: str = "cpu", planner: BudgetPlanner | None = None, shape: tuple[int, int] | None = None,
) -> list[BlockOption]:
    """The option of each of ``n_blocks`` blocks under ``config.strategy`` (see the module docstring).

    ``has_anatomy``: the blocks' roles can be read (False for blocks given without an anatomy); ``backend``: the
    attention backend (``flash_attn`` imports flash-attn so selective_op's default finds its ops); ``device_type``:
    where the model runs; ``planner`` and ``shape`` (batch, seq): the budget strategy's planner and the input shape
    to plan (``BudgetTooSmall`` if its budget is below the smallest achievable peak there)."""
    strategy = config.strategy
    if strategy == "none":
        return [NONE] * n_blocks
    if strategy == "full":
        return [FULL] * n_blocks
    if strategy == "every_k":
        if not 1 <= config.k <= n_blocks:
            raise ValueError(
                f"every_k: k={config.k} is outside the valid range 1..n_layer ({n_blocks}) for this {n_blocks}-block model"
            )
        return [FULL if i % config.k == 0 else NONE for i in range(n_blocks)]
    if strategy == "selective_op":
        return [selective_op_option(config, has_anatomy, backend)] * n_blocks
    if strategy == "offload":
        if device_type != "cuda":
            raise StrategyUnavailable(
                f"offload moves activations from GPU to CPU memory; on a {device_type.upper()} run there is nothing to offload"
            )
        return [OFFLOAD] * n_blocks
    if strategy == "budget":
        if planner is None or shape is None:
            raise ValueError("budget: the plan depends on the input shape; pass the planner and the (batch, seq) shape")
        options = planner.plan(*shape).block_options()
        if len(options) != n_blocks:
            raise ValueError(f"budget: the planner's costs have {len(options)} blocks, the model {n_blocks}")
        return options
    raise ValueError(f"unknown activation strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")


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
