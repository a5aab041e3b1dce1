"""Causal attention with dropout, forward and backward by hand, on (B, nh, T, hs) tensors: the arithmetic of the
fake flash-attn packages. The dropout mask is drawn inside, from the default generator, as the real kernel draws
from the CUDA generator's philox offset: opaque to anything that only sees the call."""

import math

import torch


def forward(q, k, v, dropout_p):
    scale = 1.0 / math.sqrt(q.size(-1))
    T = q.size(-2)
    scores = (q @ k.transpose(-2, -1)) * scale
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    keep = (torch.rand(probs.shape) >= dropout_p).to(q.dtype) if dropout_p > 0 else torch.ones_like(probs)
    dropped = probs * keep / (1.0 - dropout_p)
    return dropped @ v, keep


def backward(grad_out, q, k, v, keep, dropout_p):
    scale = 1.0 / math.sqrt(q.size(-1))
    T = q.size(-2)
    scores = (q @ k.transpose(-2, -1)) * scale
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    dropped = probs * keep / (1.0 - dropout_p)
    grad_v = dropped.transpose(-2, -1) @ grad_out
    grad_probs = (grad_out @ v.transpose(-2, -1)) * keep / (1.0 - dropout_p)
    grad_scores = probs * (grad_probs - (grad_probs * probs).sum(-1, keepdim=True))
    return grad_scores @ k * scale, grad_scores.transpose(-2, -1) @ q * scale, grad_v
