import torch

import attention_math


@torch.library.custom_op("flashattn::_flash_attn_forward", mutates_args=())
def _flash_attn_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    out, keep = attention_math.forward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p)
    return out.transpose(1, 2).contiguous(), keep


@_flash_attn_forward.register_fake
def _(q, k, v, dropout_p):
    B, T, nh, _ = q.shape
    return torch.empty_like(q), q.new_empty(B, nh, T, T)


class FlashAttnFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, dropout_p):
        out, keep = torch.ops.flashattn._flash_attn_forward(q, k, v, dropout_p)
        ctx.save_for_backward(q, k, v, keep)
        ctx.dropout_p = dropout_p
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, keep = ctx.saved_tensors
        t = lambda x: x.transpose(1, 2)  # noqa: E731
        dq, dk, dv = attention_math.backward(t(grad_out), t(q), t(k), t(v), keep, ctx.dropout_p)
        return t(dq), t(dk), t(dv), None


def flash_attn_func(q, k, v, dropout_p=0.0, causal=False):
    assert causal
    return FlashAttnFunc.apply(q, k, v, dropout_p)
