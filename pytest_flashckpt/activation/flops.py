"""Recomputation made visible without a clock: FLOPs of one training step (forward + backward).

``measure_step_flops`` runs a step under ``torch.utils.flop_counter.FlopCounterMode``, which counts matmuls and
attention kernels (2 FLOPs per multiply-add). PyTorch's registry has no formula for the CPU flash kernel
(``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward), so SDPA on a CPU would silently count
zero attention FLOPs; this module registers the same formulas PyTorch uses for the CUDA flash kernel (forward:
two batched matmuls; backward: five, because the kernel recomputes the score matrix). FlopCounterMode ignores
pointwise ops, which is exactly the work op-level selective checkpointing recomputes, so the step also records
``pointwise_elements`` (output elements of ops tagged pointwise) and per-op call counts.

MFU and HFU (``pytest_flashckpt.throughput``) read two counts of this module: a scenario's own step is its
*hardware* FLOPs (recomputation included), the reference's step (no recompute, same model and batch) its *model*
FLOPs, the useful work. The GEMM shapes the step ran (``StepFlops.gemm_shapes``) are what the measured matmul
roofline is timed at, so "achieved / roofline" compares the step with matmuls of its own sizes.

``activation.expected_flops.expected_matmul_flops`` is the closed form (every family that gives its block's
widths, every strategy whose plan it can read), so tests compare measurement with arithmetic rather than with a
tolerance: full recompute adds one forward of every block but not of the embeddings, head and loss,
which puts it a little under the textbook 4/3.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from pytest_flashckpt.training import Trainer, make_batch

_aten = torch.ops.aten


def _cpu_flash_forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_flash_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


CPU_FLASH_FORMULAS = {
    _aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_forward,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward,
}


def _bhtd(shape):
    """flash-attn's (batch, seq, heads, head_dim) as SDPA's (batch, heads, seq, head_dim)."""
    b, t, h, d = shape
    return (b, h, t, d)


def _flash_attn_forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(_bhtd(query_shape), _bhtd(key_shape), _bhtd(value_shape))


def _flash_attn_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(_bhtd(grad_out_shape), _bhtd(query_shape), _bhtd(key_shape), _bhtd(value_shape))


def flash_attn_formulas() -> dict:
    """Formulas for flash-attn >= 2.7's custom ops (``flash_attn::`` / ``flashattn::`` ``_flash_attn_forward`` and
    ``_flash_attn_backward``), registered only once flash-attn is imported: FlopCounterMode has none, so without
    them a flash_attn step counts zero attention FLOPs and its MFU reads low. Same formulas as SDPA's flash kernel
    (the backward recomputes the scores), on flash-attn's (B, T, H, D) layout. flash-attn < 2.7 calls its kernel
    from Python, unseen by the dispatcher: its attention FLOPs stay uncounted (``models.attention``)."""
    out = {}
    for namespace in ("flash_attn", "flashattn"):
        for name, formula in (("_flash_attn_forward", _flash_attn_forward), ("_flash_attn_backward", _flash_attn_backward)):
            try:
                out[getattr(getattr(torch.ops, namespace), name)] = formula
            except (AttributeError, RuntimeError):
                continue
    return out


@dataclass(frozen=True)
class StepFlops:
    """One forward + backward. ``matmul_flops``: FlopCounterMode's total (matmuls and attention kernels);
    ``pointwise_elements``: elements written by pointwise ops (what FlopCounterMode does not count);
    ``op_calls``: how often each aten op ran (recomputed ops run twice); ``gemm_shapes``: FLOPs per 2-D GEMM shape
    ``(M, K, N)`` of the ``mm``/``addmm`` calls (the Linears, forward and backward)."""

    matmul_flops: int
    pointwise_elements: int
    op_calls: Counter
    gemm_shapes: Counter = field(default_factory=Counter)

    def ratio(self, reference: "StepFlops") -> float:
        return self.matmul_flops / reference.matmul_flops


_GEMMS = {_aten.mm: 0, _aten.addmm: 1}  # overload packet -> index of the first matrix operand


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()
        self.pointwise_elements = 0
        self.gemm_shapes: Counter[tuple[int, int, int]] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.calls[str(func.overloadpacket)] += 1
        first = _GEMMS.get(func.overloadpacket)
        if first is not None:
            (m, k), (_, n) = args[first].shape, args[first + 1].shape
            self.gemm_shapes[(int(m), int(k), int(n))] += 2 * m * k * n
        if torch.Tag.pointwise in func.tags:
            first = out[0] if isinstance(out, (tuple, list)) else out
            if isinstance(first, torch.Tensor):
                self.pointwise_elements += first.numel()
        return out


class StepCount:
    """FlopCounterMode (with the CPU flash and flash-attn formulas) and the op counter as one context, held around
    a forward + backward; ``flops()`` reads the count afterwards. The op counter sits inside FlopCounterMode, so
    ops that selective checkpointing serves from its cache during recomputation are (correctly) counted by
    neither. ``measure_step_flops`` runs a step in it; the runner holds it around the forward and backward of a
    trainer's first warm-up step (``Trainer.train_step``'s ``around``, when ``counts_as_measured`` says that step
    is the one ``count_step`` counts), which saves a forward + backward per trainer."""

    def __init__(self) -> None:
        self._counter = FlopCounterMode(display=False, custom_mapping={**CPU_FLASH_FORMULAS, **flash_attn_formulas()})
        self._ops = _OpCounter()
        self._held = contextlib.ExitStack()

    def __enter__(self) -> "StepCount":
        self._held.enter_context(self._counter)
        self._held.enter_context(self._ops)
        return self

    def __exit__(self, *exc) -> None:
        self._held.close()

    def flops(self) -> StepFlops:
        ops = self._ops
        return StepFlops(self._counter.get_total_flops(), ops.pointwise_elements, ops.calls, ops.gemm_shapes)


def measure_step_flops(model: nn.Module, batch_size: int, seq_len: int, seed: int = 0) -> StepFlops:
    """Count one training forward + backward of ``model`` (a GPT, strategy already applied) on batch 0 of
    ``seed``; gradients are left in ``model``."""
    model.train()
    device = next(model.parameters()).device
    x, y = make_batch(model.config.vocab_size, batch_size, seq_len, seed, 0, device)
    with StepCount() as count:
        torch.manual_seed(seed)
        model(x, y).backward()
    return count.flops()


def counts_as_measured(trainer: Trainer) -> bool:
    """Whether the forward + backward of ``trainer``'s next ``train_step()`` is the step ``count_step`` counts: a
    plain ``Trainer`` (no user's step or layout's), at data position 0 (a fresh trainer's first step), without
    autocast and with the plain loss (``model(x, y)``). Its counts are then ``count_step``'s, every field (the
    global RNG, which only dropout reads, picks values, not ops; tests/activation/test_flops.py checks it)."""
    return (type(trainer) is Trainer and trainer.step == 0 and trainer.autocast is None
            and trainer.impl.loss == "plain")


def count_step(trainer: Trainer) -> StepFlops:
    """One forward + backward of ``trainer``'s model at its batch shape, counted. No optimizer step is taken and
    the gradients are cleared afterwards, so the trainer's state is as before (only the global RNG has advanced)."""
    flops = measure_step_flops(trainer.model, trainer.batch_size, trainer.seq_len, trainer.seed)
    trainer.model.zero_grad(set_to_none=True)
    return flops


def count_step_flops(trainer: Trainer) -> int:
    """Matmul + attention FLOPs of one forward + backward of ``trainer``'s model (what the runner records as
    ``step_flops``); see :func:`count_step`."""
    return count_step(trainer).matmul_flops
