"""Causal self-attention kernels: ``flash_attn`` (the flash-attn package), ``sdpa`` (PyTorch's fused kernels)
and ``eager`` (materialises the T x T score matrix: the O(T^2) reference).

Which kernel *actually* ran is not assumed from the request: ``detect_kernel`` classifies the aten / custom op
names seen while the model ran (``aten::_scaled_dot_product_flash_attention_for_cpu`` is PyTorch's CPU flash
kernel; SDPA with dropout on a CPU falls back to the math path, which this records as ``sdpa-math``; flash-attn
>= 2.7 runs as ``flashattn::`` custom ops, older releases are recognised by the Python-level call).

Grouped-query attention (k and v with fewer heads than q, Llama's ``n_kv_head``) goes to each kernel in the form
it takes: flash-attn and the flash kernels (CPU and CUDA, the aten ops accept k/v with fewer heads, on ``meta``
too) take the grouped heads natively; SDPA is asked with ``enable_gqa=True`` where it would pick such a kernel (a
CPU, or 16-bit on CUDA); the mem-efficient and cuDNN ops, SDPA in float32 on CUDA (mem-efficient, which does not
take GQA: SDPA would fall back to its math path) and eager attention get k and v repeated to every query head
(``repeat_kv``), as a model without GQA support would do.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Collection
from typing import Literal

import torch
import torch.nn.functional as F

Backend = Literal["auto", "flash_attn", "sdpa", "eager"]
BACKENDS: tuple[str, ...] = ("auto", "flash_attn", "sdpa", "eager")

# flash-attn < 2.7 calls its CUDA extension straight from Python: the dispatcher (and so a dispatch mode) never sees
# it. causal_attention notes the call under this name for the OpNameRecorders that are recording.
PYTHON_FLASH_ATTN_CALL = "python:flash_attn.flash_attn_func"
_RECORDING: list[set[str]] = []

# op name fragment -> kernel label, checked in order (first match wins)
_KERNEL_SIGNATURES: tuple[tuple[str, str], ...] = (
    ("flashattn::", "flash_attn"),  # flash-attn >= 2.7 custom ops (flashattn::_flash_attn_forward)
    ("flash_attn::", "flash_attn"),
    (PYTHON_FLASH_ATTN_CALL, "flash_attn"),  # flash-attn 2.5 / 2.6: no registered op, the Python-level call
    ("flash_attn_", "flash_attn"),
    ("_scaled_dot_product_flash_attention_for_cpu", "sdpa-flash-cpu"),
    ("_scaled_dot_product_flash_attention", "sdpa-flash"),
    ("_scaled_dot_product_cudnn_attention", "sdpa-cudnn"),
    ("_scaled_dot_product_efficient_attention", "sdpa-mem-efficient"),
)


# Explicit aten attention ops: backends named after the kernel label, calling that op directly instead of letting
# F.scaled_dot_product_attention choose. Used by the simulator (``pytest_flashckpt.simulate``) on the ``meta``
# device, where SDPA's own choice is the math path: calling the op saves exactly what that kernel saves for its
# backward (flash: output + float32 logsumexp (B, H, T) + RNG seed/offset; efficient: logsumexp padded to 32).
# Each has an autograd formula in PyTorch, so the backward runs the kernel's own backward op.
EXPLICIT_OPS: tuple[str, ...] = ("sdpa-flash-cpu", "sdpa-flash", "sdpa-mem-efficient", "sdpa-cudnn")


# explicit ops whose kernels take k/v with fewer heads than q (FlashAttention-2 handles GQA itself); the others
# get k/v repeated (the mem-efficient op's meta backward refuses grouped heads)
_GQA_NATIVE_OPS = ("sdpa-flash-cpu", "sdpa-flash")


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, kv_heads, T, hs) -> (B, kv_heads * n_rep, T, hs): each key/value head repeated for its query group."""
    if n_rep == 1:
        return x
    B, H, T, D = x.shape
    return x[:, :, None].expand(B, H, n_rep, T, D).reshape(B, H * n_rep, T, D)


def _sdpa_takes_gqa(q: torch.Tensor) -> bool:
    """Whether SDPA would run a kernel that takes grouped heads: its CPU flash kernel, or CUDA flash (16-bit)."""
    return q.device.type != "cuda" or q.dtype in (torch.float16, torch.bfloat16)


def _explicit_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str, dropout_p: float) -> torch.Tensor:
    aten = torch.ops.aten
    if backend == "sdpa-flash-cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, True)[0]
    if backend == "sdpa-flash":
        return aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, True)[0]
    if backend == "sdpa-mem-efficient":
        return aten._scaled_dot_product_efficient_attention(q, k, v, None, q.requires_grad, dropout_p, True)[0]
    return aten._scaled_dot_product_cudnn_attention(q, k, v, None, q.requires_grad, dropout_p, True, False)[0]


class BackendUnavailable(RuntimeError):
    """The requested attention kernel cannot run here; the message says why (used as a skip reason)."""


def flash_attn_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the flash-attn package cannot run on ``device``/``dtype``, or None if it can."""
    if importlib.util.find_spec("flash_attn") is None:
        return "flash-attn is not installed (pip install 'pytest-flashckpt[gpu]' on a CUDA machine)"
    if device.type != "cuda":
        return f"flash-attn runs on CUDA GPUs only, this run is on {device.type}"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"flash-attn needs float16 or bfloat16, this run uses {str(dtype).removeprefix('torch.')}"
    major, _ = torch.cuda.get_device_capability(device)
    if major < 8:
        return f"flash-attn 2 needs an sm80+ GPU (Ampere or newer), this one is sm{major}x"
    return None


def resolve_backend(requested: str, device: torch.device, dtype: torch.dtype) -> str:
    """The concrete backend for ``requested``: ``auto`` prefers flash-attn, then SDPA."""
    if requested not in BACKENDS:
        raise ValueError(f"unknown attention backend {requested!r}; valid: {', '.join(BACKENDS)}")
    if requested == "auto":
        return "flash_attn" if flash_attn_unavailable_reason(device, dtype) is None else "sdpa"
    if requested == "flash_attn":
        reason = flash_attn_unavailable_reason(device, dtype)
        if reason is not None:
            raise BackendUnavailable(reason)
    return requested


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str, dropout_p: float) -> torch.Tensor:
    """Causal attention on (B, nh, T, hs) tensors with a concrete backend; returns (B, nh, T, hs).

    k and v may have fewer heads than q (grouped-query attention: nh a multiple of theirs); see the module
    docstring for how each kernel receives them."""
    n_rep = q.size(1) // k.size(1)
    if n_rep * k.size(1) != q.size(1):
        raise ValueError(f"attention: {q.size(1)} query heads are not a multiple of {k.size(1)} key/value heads")
    if backend == "sdpa":
        if n_rep > 1 and _sdpa_takes_gqa(q):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, enable_gqa=True)
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    if backend != "flash_attn" and backend not in _GQA_NATIVE_OPS:
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    if backend == "eager":
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, T, T)
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = F.dropout(att, p=dropout_p, training=dropout_p > 0)
        return att @ v  # (B, nh, T, hs)
    if backend == "flash_attn":
        from flash_attn import flash_attn_func

        for names in _RECORDING:
            names.add(PYTHON_FLASH_ATTN_CALL)
        # flash-attn wants (B, T, nh, hs)
        out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=dropout_p, causal=True)
        return out.transpose(1, 2)
    if backend in EXPLICIT_OPS:
        return _explicit_op(q, k, v, backend, dropout_p)
    raise ValueError(f"attention backend {backend!r} must be resolved first (see resolve_backend)")


def detect_kernel(op_names: Collection[str], backend: str) -> str:
    """Label of the attention kernel that ran, from the op names recorded during a forward/backward."""
    for fragment, label in _KERNEL_SIGNATURES:
        if any(fragment in name for name in op_names):
            return label
    if backend == "sdpa":
        return "sdpa-math"
    if backend == "eager":
        return "eager"
    return f"unknown ({backend})"


class OpNameRecorder:
    """Records the aten/custom op names that run inside it (for ``detect_kernel``); cheap enough for one step."""

    def __init__(self) -> None:
        self.op_names: set[str] = set()

    def __enter__(self) -> "OpNameRecorder":
        from torch.utils._python_dispatch import TorchDispatchMode

        names = self.op_names

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                names.add(str(func.name()))
                return func(*args, **(kwargs or {}))

        self._mode = _Mode()
        self._mode.__enter__()
        _RECORDING.append(names)
        return self

    def __exit__(self, *exc) -> None:
        _RECORDING.remove(self.op_names)
        self._mode.__exit__(*exc)
