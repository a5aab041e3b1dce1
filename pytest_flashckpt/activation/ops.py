"""The op table: every aten (and flash-attn) op the activation strategies name, once.

The role policy (``activation.policy``) classifies what the dispatcher hands it by these sets: a Linear's matmul
(``mm``/``addmm``, labelled by the role of the module running it), an attention kernel (every fused SDPA variant, the
eager/math path's ``bmm``, flash-attn's custom forward ops), or neither. ``selective_op``'s save list is a set of
*overloads* (``aten.mm.default``) because that is what the dispatcher hands the policy: ``resolve_op`` turns a name
into the overload up front, so a typo is an error at configuration time.

The default save list follows the field's op-level policy (torch's ``get_default_op_list`` compute-intensive ops,
torchtitan's ``_save_list``): the matmuls and the attention kernel are saved (expensive to recompute, small
compared with the pointwise chain around them), pointwise work is recomputed.
"""

from __future__ import annotations

import importlib
import importlib.util

import torch

_aten = torch.ops.aten

# A Linear (and transformers' Conv1D) lowers to addmm with a bias, mm without.
LINEAR_OPS: tuple[torch._ops.OpOverload, ...] = (_aten.addmm.default, _aten.mm.default)
# Eager attention (and SDPA's math path) runs two of these per block: scores and weighted values.
BMM = _aten.bmm.default
# Every fused SDPA kernel variant.
SDPA_KERNELS: tuple[str, ...] = (
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_cudnn_attention.default",
)
ATTENTION_KERNELS: tuple[torch._ops.OpOverload, ...] = tuple(
    getattr(_aten, name.split(".")[1]).default for name in SDPA_KERNELS
)
# flash-attn >= 2.7 registers its kernels as torch custom ops when ``flash_attn`` is imported (namespace
# ``flashattn``, flash_attn/flash_attn_interface.py); ``flash_attn::`` is the namespace of newer interfaces.
# 2.5 / 2.6 call the CUDA extension from Python, invisible to the dispatcher: selective_op then recomputes
# attention (the reason the ``gpu`` extra asks for >= 2.7). Matched by name: they may not exist in this process.
FLASH_ATTN_OPS: tuple[str, ...] = (
    "flashattn._flash_attn_forward.default",
    "flashattn._flash_attn_varlen_forward.default",
    "flash_attn._flash_attn_forward.default",
    "flash_attn._flash_attn_varlen_forward.default",
)
# selective_op's default: matmuls (Linear lowers to addmm/mm, eager attention to bmm) and every fused SDPA kernel
# (``default_save_ops`` adds the flash-attn ops that exist).
DEFAULT_SAVE_OPS: tuple[str, ...] = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default", *SDPA_KERNELS)


def is_linear(func) -> bool:
    """A Linear's matmul (``mm``/``addmm``): the op whose role is read from the module running it."""
    return func in LINEAR_OPS


def is_attention(func) -> bool:
    """An attention op: a fused SDPA kernel, the math path's ``bmm``, or a flash-attn custom forward op."""
    return func in ATTENTION_KERNELS or func is BMM or str(func) in FLASH_ATTN_OPS


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
