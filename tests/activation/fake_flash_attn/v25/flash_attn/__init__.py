"""A CPU stand-in for flash-attn 2.5 / 2.6: ``flash_attn_func`` computes in Python (the real one calls its CUDA
extension from Python), so no ``flash_attn`` op ever reaches the dispatcher."""

import torch

import attention_math

__version__ = "2.5.9+fake"


class _Func(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, dropout_p):
        with torch._C.DisableTorchFunction(), torch.utils._python_dispatch._disable_current_modes():
            out, keep = attention_math.forward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p)
        ctx.save_for_backward(q, k, v, keep)
        ctx.dropout_p = dropout_p
        return out.transpose(1, 2).contiguous()

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, keep = ctx.saved_tensors
        t = lambda x: x.transpose(1, 2)  # noqa: E731
        dq, dk, dv = attention_math.backward(t(grad_out), t(q), t(k), t(v), keep, ctx.dropout_p)
        return t(dq), t(dk), t(dv), None


def flash_attn_func(q, k, v, dropout_p=0.0, causal=False):
    assert causal
    return _Func.apply(q, k, v, dropout_p)
