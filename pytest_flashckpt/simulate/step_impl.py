"""The step's implementation choices (``config.step_impl``) on ``meta``, where the target device would run
something meta does not: the CUDA fused RMSNorm kernel and fused AdamW.

- Fused norm, target ``cuda``: ``F.rms_norm`` calls ``_fused_rms_norm`` on CUDA, whose autograd node
  (``FusedRmsNormBackward0``) keeps the input, the weight and the float32 rstd (``result1``); on meta (as on a
  CPU) ``F.rms_norm`` decomposes into plain ops, which keep a float32 copy of the input instead.
  ``stand_in_cuda_fused_norms`` makes the model's ``nn.RMSNorm`` modules run ``FusedRmsNormOnMeta``: the
  forward is ``_fused_rms_norm``'s meta path (its decomposition, under no grad: only the output and rstd
  survive), the saved tensors are the CUDA node's, the backward is ``_fused_rms_norm_backward``'s meta kernel.
  The decomposition's float32 temporaries exist for the instant of each norm's forward (a fused kernel has
  none): the one over-count, transient, and never the step's peak (the logits and the loss come later).
  Target ``cpu``: nothing to do, meta runs the CPU's decomposition.
- ``adamw_fused``: torch's fused AdamW refuses meta parameters only in its device check (``_fused_adamw_`` has a
  meta kernel); ``FusedAdamWOnMeta`` lifts that check for the simulated step, so the step is torch's own
  fused AdamW (state and in-place update), not a model of it.
"""

from __future__ import annotations

import sys
from unittest import mock

import torch

from pytest_flashckpt.config.step_impl import StepImpl


class FusedRmsNormOnMeta(torch.autograd.Function):
    """``_fused_rms_norm`` as CUDA's autograd runs it, on meta tensors (module docstring)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor | None, normalized_shape: list[int], eps: float | None):
        y, rstd = torch.ops.aten._fused_rms_norm(x, normalized_shape, weight, eps)
        ctx.normalized_shape = normalized_shape
        ctx.save_for_backward(x, weight, rstd)  # FusedRmsNormBackward0: input, weight, result1
        ctx.mark_non_differentiable(rstd)
        return y, rstd

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor, _grad_rstd):
        x, weight, rstd = ctx.saved_tensors
        mask = [ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[1]]
        grad_x, grad_w = torch.ops.aten._fused_rms_norm_backward(grad_y, x, ctx.normalized_shape, rstd, weight, mask)
        return grad_x, grad_w, None, None


def stand_in_cuda_fused_norms(model: torch.nn.Module) -> int:
    """Every ``nn.RMSNorm`` of ``model`` (on meta) runs CUDA's fused kernel's autograd (``FusedRmsNormOnMeta``);
    returns how many. Set per module (an instance ``forward``) rather than by a function mode: the autograd engine
    runs the backward, and so activation checkpointing's recompute, with no function mode on."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.RMSNorm)]
    for norm in norms:
        norm.forward = _fused_forward(norm)
    return len(norms)


def _fused_forward(norm: torch.nn.RMSNorm):
    def forward(x: torch.Tensor) -> torch.Tensor:
        return FusedRmsNormOnMeta.apply(x, norm.weight, list(norm.normalized_shape), norm.eps)[0]

    return forward


class FusedAdamWOnMeta:
    """Torch's ``AdamW(fused=True)`` steps meta parameters inside (module docstring): its device check lifted, only
    while entered; re-entrant, as the simulated step enters its modes once per step."""

    def __enter__(self) -> "FusedAdamWOnMeta":
        adam = sys.modules["torch.optim.adam"]  # the module (torch.optim.adam is a function by attribute access)
        self._patch = mock.patch.object(adam, "_device_dtype_check_for_fused", lambda *_args, **_kwargs: None)
        self._patch.start()
        return self

    def __exit__(self, *exc) -> None:
        self._patch.stop()


def impl_modes(impl: StepImpl) -> list:
    """The contexts a simulated step of ``impl`` runs under (re-entrant: entered once per step)."""
    modes: list = []
    if impl.optimizer == "adamw_fused":
        modes.append(FusedAdamWOnMeta())
    return modes
