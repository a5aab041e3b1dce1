"""What the planner may do with one block: keep everything, save some op outputs and recompute the rest, or
recompute the whole block (and, on a GPU, offload its saved tensors to host memory).

A selective option names *roles* of the block's ops rather than aten overloads, because the planner chooses per
block and the same role lowers to different kernels (CPU flash kernel, CUDA flash, the eager / math path's
``bmm``). The roles are the anatomy's (``models.anatomy``), read at run time from the module that runs the matmul
(``current_role()``), never from its position in forward order, and grouped so that one option means the same on
every family: ``qkv`` (GPT's fused attn.c_attn; Llama's q_proj, k_proj and v_proj), ``attn`` (the attention
kernel, or both ``bmm`` of math attention), ``o`` (attn.c_proj / self_attn.o_proj), ``up`` (mlp.c_fc; Llama's
gate_proj and up_proj), ``down`` (mlp.c_proj / mlp.down_proj). A Linear matmul outside every role module is an
error naming the block (``selective.UnlabelledMatmul``). Everything not saved is recomputed in the backward pass
under ``torch.utils.checkpoint`` with the RNG state preserved. Ops that draw random numbers (dropout) are never
saved by these policies, so a replay draws exactly the numbers the forward drew, in the same order: the policy
cannot desynchronise the RNG (see ``tests/activation/test_budget.py``, bitwise gradients with dropout).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from pytest_flashckpt.activation.selective import FLASH_ATTN_OPS, UnlabelledMatmul
from pytest_flashckpt.models.anatomy import current_role

ROLES = ("qkv", "attn", "o", "up", "down")
# anatomy projection role -> the option role (group) it belongs to
ROLE_GROUP = {"qkv": "qkv", "q": "qkv", "k": "qkv", "v": "qkv", "o": "o", "up": "up", "gate": "up", "down": "down"}
_aten = torch.ops.aten
_LINEAR_OPS = (_aten.addmm.default, _aten.mm.default)
_ATTENTION_OPS = tuple(
    getattr(_aten, name).default
    for name in (
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    )
)


@dataclass(frozen=True)
class BlockOption:
    """One way to run a block. ``kind``: none | selective | full | offload; ``saves``: roles kept (selective)."""

    kind: str
    saves: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        if self.kind == "selective":
            return "save(" + "+".join(self.saves) + ")"
        return self.kind

    def context_fn(self, where: str = "block"):
        """``checkpoint(context_fn=...)`` for a selective option (``where`` names the block in errors); None
        otherwise."""
        if self.kind != "selective":
            return None
        return partial(_contexts, frozenset(self.saves), where)


NONE = BlockOption("none")
FULL = BlockOption("full")
OFFLOAD = BlockOption("offload")
# Selective options, from most kept to least: every matmul and attention output; without the o projection (the
# project's selective_op default); the attention half only; the MLP half only; the attention kernel only.
SELECTIVE = (
    BlockOption("selective", ("qkv", "attn", "o", "up", "down")),
    BlockOption("selective", ("qkv", "attn", "up", "down")),
    BlockOption("selective", ("qkv", "attn", "up")),
    BlockOption("selective", ("qkv", "attn")),
    BlockOption("selective", ("up",)),
    BlockOption("selective", ("attn",)),
)


def default_options(device_type: str) -> tuple[BlockOption, ...]:
    """The options the planner considers on a device: offload only where there is device memory to free."""
    return (NONE, *SELECTIVE, FULL, *((OFFLOAD,) if device_type == "cuda" else ()))


def option_by_name(name: str) -> BlockOption:
    for option in (NONE, FULL, OFFLOAD, *SELECTIVE):
        if option.name == name:
            return option
    raise ValueError(f"unknown block option {name!r}")


def _contexts(saves: frozenset[str], where: str):
    return create_selective_checkpoint_contexts(_RolePolicy(saves, where))


class _RolePolicy:
    """Per checkpointed forward: MUST_SAVE for the outputs of the chosen roles, PREFER_RECOMPUTE otherwise.
    A Linear matmul's role is the anatomy role of the module running it (``current_role()``, set by the role
    hooks ``runtime.install_planned_forwards`` puts on each block); math attention's two ``bmm`` and the
    flash-attn package's custom forward ops (>= 2.7, ``selective.FLASH_ATTN_OPS``) belong to ``attn``, so a plan
    simulated with the aten flash op (``simulate.kernels``) saves the same tensors on a GPU."""

    def __init__(self, saves: frozenset[str], where: str = "block") -> None:
        self.saves = saves
        self.where = where

    def __call__(self, ctx, func, *args, **kwargs) -> CheckpointPolicy:
        role = None
        if func in _LINEAR_OPS:
            projection = current_role()
            if projection is None:
                raise UnlabelledMatmul(
                    f"{self.where} ran {func} outside every projection of its anatomy, so the budget plan cannot "
                    "tell which role it is; the block's anatomy must name every matmul module"
                )
            role = ROLE_GROUP[projection]
        elif func in _ATTENTION_OPS or func is _aten.bmm.default or str(func) in FLASH_ATTN_OPS:
            role = "attn"
        return CheckpointPolicy.MUST_SAVE if role in self.saves else CheckpointPolicy.PREFER_RECOMPUTE
