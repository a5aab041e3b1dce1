"""What a block may do with its activations: the per-block option every activation strategy is made of.

Every strategy is a plan, one ``BlockOption`` per block (``activation.plan.plan_for``), and one wrapper runs a
block's forward under its option (``activation.wrapper.BlockForward``):

- ``none``: keep everything (a plain forward);
- ``full``: keep the block input only and recompute the whole block in the backward pass;
- ``by_role``: keep the outputs of the op *roles* in ``saves`` and recompute the rest (the budget planner's
  options, ``BY_ROLE``);
- ``by_op``: keep the outputs of the listed aten overloads (``ops``) and recompute the rest, except the matmuls of
  the projection roles in ``recompute`` (the ``selective_op`` strategy: its save list is user-facing, in ops);
- ``offload``: keep everything, in host memory (a GPU's saved tensors go to pinned CPU memory).

A ``by_role`` option names roles rather than aten overloads because the planner chooses per block and the same
role lowers to different kernels (CPU flash kernel, CUDA flash, the eager / math path's ``bmm``). The roles are
the anatomy's (``models.anatomy``), read at run time from the module that runs the matmul (``current_role()``),
never from its position in forward order, and grouped so that one option means the same on every family: ``qkv``
(GPT's fused attn.c_attn; Llama's q_proj, k_proj and v_proj), ``attn`` (the attention kernel, or both ``bmm`` of
math attention), ``o`` (attn.c_proj / self_attn.o_proj), ``up`` (mlp.c_fc; Llama's gate_proj and up_proj),
``down`` (mlp.c_proj / mlp.down_proj). Which op is which is ``activation.ops``; the decision is
``activation.policy.RolePolicy``. Ops that draw random numbers are never saved by it, so a replay draws exactly
the numbers the forward drew, in the same order (``tests/activation/test_budget.py``: bitwise gradients with
dropout).

This module is data only (no torch): costs, the solver, the planner and the simulator all read it.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS: tuple[str, ...] = ("none", "by_role", "by_op", "full", "offload")
ROLES: tuple[str, ...] = ("qkv", "attn", "o", "up", "down")
# anatomy projection role -> the option role (group) it belongs to
ROLE_GROUP: dict[str, str] = {"qkv": "qkv", "q": "qkv", "k": "qkv", "v": "qkv", "o": "o", "up": "up", "gate": "up", "down": "down"}
# A MoE block's (models.moe): the router and the experts' gate/up read the MLP's input, as up does; expert_down is down
ROLE_GROUP.update(router="up", shared_expert_gate="up", expert_gate="up", expert_up="up", expert_down="down")
# With selective_op's default list, the matmuls of these roles are recomputed although addmm/mm is saved; chosen by
# measurement on both families (benchmarks/selective_default.py, reports/selective-default.md: a search over the
# roles' subsets, exact peaks and FlopCounterMode FLOPs). ``down`` (mlp.c_proj / mlp.down_proj) ends the block and
# no backward reads its output (the residual add saves nothing), so a replay stops before it: B*T*C fewer elements
# kept per block for no FLOPs (with dropout after it, as in GPT with dropout > 0, the replay must run it again to
# redraw the mask: 4C multiply-adds per element). ``o`` (attn.c_proj / self_attn.o_proj) is the cheapest output to
# rebuild: C multiply-adds per element from an input (the attention output) that is saved anyway. The rest is what
# the backward reads (qkv's output for attention, up/gate's for the activation function); rebuilding any of it as
# well costs more than the +3% FLOPs the report's bar allows (GPT's fused qkv 3C, up 4C multiply-adds per element;
# Llama's q alone as much again as o). Unlike torchtitan's "every second mm", which matmul is recomputed is chosen
# by role.
DEFAULT_RECOMPUTE_ROLES: tuple[str, ...] = ("o", "down")


@dataclass(frozen=True)
class BlockOption:
    """One way to run a block (see the module docstring). ``saves``: role groups kept (``by_role``); ``ops``:
    overload names kept (``by_op``); ``recompute``: projection roles whose matmuls a ``by_op`` option recomputes
    though listed; ``strict`` (``by_op``): a Linear matmul outside every role module is an error, as it always is
    for ``by_role`` (False only for blocks given without an anatomy, which have no roles to check against)."""

    kind: str
    saves: tuple[str, ...] = ()
    ops: tuple[str, ...] = ()
    recompute: tuple[str, ...] = ()
    strict: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown block option kind {self.kind!r}; valid: {', '.join(KINDS)}")
        unknown = sorted(set(self.saves) - set(ROLES))
        if unknown:
            raise ValueError(f"block option: unknown role(s) {', '.join(unknown)}; valid: {', '.join(ROLES)}")
        if self.kind == "by_role" and not self.strict:
            raise ValueError("block option by_role: roles are read from the anatomy, so it is always strict")
        if self.kind == "by_op" and not self.ops:
            raise ValueError("block option by_op: no ops listed, so nothing would be saved")
        if (self.saves and self.kind != "by_role") or ((self.ops or self.recompute) and self.kind != "by_op"):
            raise ValueError(f"block option {self.kind!r}: saves= is for by_role, ops=/recompute= for by_op")

    @property
    def name(self) -> str:
        """How plans and reports show it: ``none``, ``full``, ``offload``, ``save(qkv+attn)``, ``save_ops(7)``."""
        if self.kind == "by_role":
            return "save(" + "+".join(self.saves) + ")"
        if self.kind == "by_op":
            return f"save_ops({len(self.ops)}" + (f"; recompute {'+'.join(self.recompute)})" if self.recompute else ")")
        return self.kind

    @property
    def reads_roles(self) -> bool:
        """Whether the option's policy reads the role of the module running a matmul (``role_hooks``)."""
        return self.kind in ("by_role", "by_op")


NONE = BlockOption("none")
FULL = BlockOption("full")
OFFLOAD = BlockOption("offload")
# The planner's partial options, from most kept to least: every matmul and attention output; without the o
# projection; the attention half only; the MLP half only; the attention kernel only.
BY_ROLE: tuple[BlockOption, ...] = (
    BlockOption("by_role", ("qkv", "attn", "o", "up", "down")),
    BlockOption("by_role", ("qkv", "attn", "up", "down")),
    BlockOption("by_role", ("qkv", "attn", "up")),
    BlockOption("by_role", ("qkv", "attn")),
    BlockOption("by_role", ("up",)),
    BlockOption("by_role", ("attn",)),
)


def default_options(device_type: str) -> tuple[BlockOption, ...]:
    """The options the budget planner considers on a device: offload only where there is device memory to free."""
    return (NONE, *BY_ROLE, FULL, *((OFFLOAD,) if device_type == "cuda" else ()))
