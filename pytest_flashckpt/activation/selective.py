"""Op-level selective activation checkpointing: which op outputs are saved, and proof that the list matched.

The policy saves the outputs of matmuls and attention kernels (expensive to recompute, small compared with the
pointwise chain around them) and recomputes everything else (LayerNorm, GeLU, residual adds, softmax, dropout).
A save list is a set of *overloads* (``aten.mm.default``) because that is what the dispatcher hands the policy;
names are resolved up front so a typo is an error at configuration time, and matches are counted so a list
that never fires (a kernel that is not the one that ran, e.g. only CUDA flash ops on a CPU) is an error at the
first training forward instead of a silent "full recompute of the pointwise ops, nothing saved" run.

Matmuls are labelled by the *role* of the module that runs them (``models.anatomy``: ``qkv``/``q``/``k``/``v``,
``o``, ``up``/``gate``, ``down``), read from ``current_role()`` which hooks on the role modules set, never by their
position in forward order: a GPT block runs 4 Linears, a Llama block 7. A Linear matmul (``mm``/``addmm``) that
runs outside every role module of a block with an anatomy is an error naming the block and the op.

The default follows the field's op-level policy (torch's ``get_default_op_list`` compute-intensive ops,
torchtitan's ``_save_list``): save the matmuls and the attention kernel, recompute pointwise work; unlike
torchtitan's "every second mm", which one is recomputed is chosen by role: the attention output projection
(``o``, see ``DEFAULT_RECOMPUTE_ROLES``).
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from pytest_flashckpt.models.anatomy import current_role

# Matmuls (Linear lowers to addmm/mm, eager attention to bmm) and every fused SDPA kernel variant.
DEFAULT_SAVE_OPS: tuple[str, ...] = (
    "aten.mm.default",
    "aten.addmm.default",
    "aten.bmm.default",
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_cudnn_attention.default",
)
# With the default list, the matmuls of these roles are recomputed although addmm/mm is saved. The attention output
# projection o (GPT's attn.c_proj, Llama's self_attn.o_proj) is the cheapest output to rebuild:
# C multiply-adds per element from an input (the attention output) that is saved anyway, and without it the
# block keeps B*T*C fewer elements. On tiny (b=4, s=512) that moves the step's peak saving from 17.6% to 21.1%
# for +1.7% matmul FLOPs. (mlp.c_proj's output is also useless to the backward, but rebuilding it costs 4C
# multiply-adds per element, and c_attn/c_fc outputs are what the attention and GeLU backward read.) On llama-tiny
# the same role is the one to rebuild for the same reason (C multiply-adds per element from a saved input).
DEFAULT_RECOMPUTE_ROLES: tuple[str, ...] = ("o",)
# The same choice by position for GPT's block (its Linear #1 is attn.c_proj): what activation.flops' closed form
# for GPT takes. The policy itself never numbers Linears.
DEFAULT_RECOMPUTE_LINEARS: tuple[int, ...] = (1,)
# flash-attn >= 2.7 registers its kernels as torch custom ops when ``flash_attn`` is imported (namespace
# ``flashattn``, flash_attn/flash_attn_interface.py); ``flash_attn::`` is the namespace of newer interfaces.
# 2.5 / 2.6 call the CUDA extension from Python, invisible to the dispatcher: selective_op then recomputes
# attention (the reason the ``gpu`` extra asks for >= 2.7).
FLASH_ATTN_OPS: tuple[str, ...] = (
    "flashattn._flash_attn_forward.default",
    "flashattn._flash_attn_varlen_forward.default",
    "flash_attn._flash_attn_forward.default",
    "flash_attn._flash_attn_varlen_forward.default",
)


def resolve_op(name: str) -> torch._ops.OpOverload:
    """``"aten.mm.default"`` -> the OpOverload; a clear ValueError for anything that is not one."""
    parts = name.split(".")
    if len(parts) != 3 or not all(parts):
        raise ValueError(
            f"save op {name!r} is not a full overload name; write namespace.op.overload, e.g. 'aten.mm.default'"
        )
    namespace, op_name, overload = parts
    try:
        packet = getattr(getattr(torch.ops, namespace), op_name)
    except (AttributeError, RuntimeError):
        raise ValueError(f"save op {name!r}: there is no operator {namespace}.{op_name} in torch.ops") from None
    if overload not in packet.overloads():
        valid = ", ".join(f"{namespace}.{op_name}.{o}" for o in packet.overloads())
        raise ValueError(f"save op {name!r}: {namespace}.{op_name} has no overload {overload!r}; valid: {valid}")
    return getattr(packet, overload)


def import_flash_attn() -> bool:
    """Import flash-attn (which registers its custom ops) if it is installed; False if it is not importable."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("flash_attn") is None:
        return False
    try:
        importlib.import_module("flash_attn.flash_attn_interface")
    except Exception:  # a broken build (ABI mismatch): the flash_attn backend reports it when it runs
        return False
    return True


def default_save_ops(backend: str | None = None) -> tuple[str, ...]:
    """DEFAULT_SAVE_OPS plus the flash-attn custom ops that exist in this process; for the ``flash_attn`` backend
    flash-attn is imported first, so its ops are registered before they are looked up."""
    if backend == "flash_attn":
        import_flash_attn()
    present = []
    for name in FLASH_ATTN_OPS:
        try:
            resolve_op(name)
        except ValueError:
            continue
        present.append(name)
    return DEFAULT_SAVE_OPS + tuple(present)


class SavePolicy:
    """The SAC policy: MUST_SAVE for the configured ops, PREFER_RECOMPUTE otherwise; counts first-forward matches.

    ``recompute_roles``: projection roles (``models.anatomy``) whose matmuls are recomputed even if listed;
    ``strict``: a Linear matmul outside every role module is an error (blocks with an anatomy; a block given
    without one has no roles to check against).

    A listed op that draws random numbers in this call (attention with ``dropout_p > 0``) is recomputed, not saved:
    a saved output is replayed without running the op, so the RNG offset it would have advanced (CUDA's philox
    offset) is not advanced, and every later random op in the recomputed region (the residual dropout) would draw a
    different mask than in the forward: wrong gradients. Recomputed in order from the restored RNG state, every
    mask is the same bit for bit. Those calls are counted in ``rng_recomputed``.

    ``matched`` counts configured ops seen in the original forward since ``reset()`` (recomputation is not
    counted, so the numbers are per training forward); ``seen`` is every op the policy was asked about, which
    makes the "matched nothing" error say what to put in the list instead.
    """

    def __init__(self, names: tuple[str, ...], recompute_roles: tuple[str, ...] = (), strict: bool = False) -> None:
        self.names = names
        self.recompute_roles = tuple(recompute_roles)
        self.strict = strict
        self._ops = {resolve_op(name): name for name in names}
        self.matched: Counter[str] = Counter()
        self.rng_recomputed: Counter[str] = Counter()
        self.seen: set[str] = set()

    def reset(self) -> None:
        self.matched.clear()
        self.rng_recomputed.clear()
        self.seen.clear()

    def __call__(self, ctx, func, *args, **kwargs) -> CheckpointPolicy:
        name = self._ops.get(func)
        if not ctx.is_recompute:
            self.seen.add(str(func))
            if name is not None:
                self.matched[name] += 1
        if name is None:
            return CheckpointPolicy.PREFER_RECOMPUTE
        if consumes_rng(func, args, kwargs):
            if not ctx.is_recompute:
                self.rng_recomputed[name] += 1
            return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE

    def context_fn(self, where: str = "block"):
        """What ``checkpoint(context_fn=...)`` calls once per checkpointed forward (``where`` names the block in
        errors; bind it with ``functools.partial``)."""
        return create_selective_checkpoint_contexts(_RegionPolicy(self, where))

    def check_matched(self) -> None:
        """Raise if none of the configured ops ran in the last forward (the list would save nothing)."""
        if self.matched:
            return
        ran = ", ".join(sorted(self.seen)) or "(no ops)"
        raise RuntimeError(
            f"selective_op: none of the configured save ops ran during the forward ({', '.join(self.names)}); "
            f"the policy would save nothing and recompute the whole block. Ops that ran: {ran}"
        )


def consumes_rng(func, args: tuple, kwargs: dict) -> bool:
    """True when this call of ``func`` draws random numbers: a ``dropout_p`` argument above 0 (the fused attention
    kernels of aten and flash-attn, which are tagged random whatever their dropout), or an op tagged
    ``nondeterministic_seeded`` without such an argument (dropout, bernoulli, rand)."""
    arguments = func._schema.arguments
    for position, argument in enumerate(arguments):
        if argument.name == "dropout_p":
            value = kwargs.get("dropout_p", args[position] if position < len(args) else argument.default_value)
            return bool(value) and float(value) > 0.0
    return torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())


_LINEAR_OPS = (torch.ops.aten.addmm.default, torch.ops.aten.mm.default)


class UnlabelledMatmul(ValueError):
    """A block ran a Linear matmul outside every projection its anatomy names (so no role could be read)."""


class _RegionPolicy:
    """Per checkpointed forward: Linear matmuls whose role (``current_role()``) is in ``recompute_roles`` are
    recomputed even though their op is in the save list; a Linear matmul with no role in a strict policy is an
    ``UnlabelledMatmul`` error naming the block."""

    def __init__(self, policy: SavePolicy, where: str) -> None:
        self.policy = policy
        self.where = where

    def __call__(self, ctx, func, *args, **kwargs) -> CheckpointPolicy:
        decision = self.policy(ctx, func, *args, **kwargs)
        if func in _LINEAR_OPS:
            role = current_role()
            if role is None and self.policy.strict:
                raise UnlabelledMatmul(
                    f"{self.where} ran {func} outside every projection of its anatomy: a matmul module without a "
                    "role (or a functional linear on a raw weight); its anatomy must name every matmul module"
                )
            if role in self.policy.recompute_roles:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return decision
