"""Strategies that need a GPU: offload, and checkpointing around the flash-attn kernels."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.models import GPTConfig, build_model
from pytest_flashckpt.training import make_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; this machine has none"),
]
SMALL = GPTConfig(vocab_size=64, block_size=128, n_layer=3, n_head=2, n_embd=64, dropout=0.1)


def step(backend: str, strategy: str, dtype: torch.dtype):
    model = build_model(SMALL, backend, "cuda", dtype)
    applied = apply_ac(model, ActivationConfig(strategy=strategy))
    x, y = make_batch(SMALL.vocab_size, 2, 64, seed=1, position=0, device="cuda")
    torch.manual_seed(0)
    loss = model(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}, applied


@pytest.mark.parametrize("strategy", ["offload", "full", "selective_op"])
@pytest.mark.parametrize("backend", ["sdpa", "flash_attn"])
def test_gpu_strategies_match_none(strategy, backend):
    if backend == "flash_attn" and importlib.util.find_spec("flash_attn") is None:
        pytest.skip("flash-attn is not installed")
    # Offload moves the same tensors and back; recomputation replays the same kernels with the same RNG state,
    # so the loss is bitwise equal. Flash attention backward kernels accumulate dq with atomics (run-to-run
    # nondeterminism even without checkpointing), so gradients are compared at bf16 tolerance.
    ref_loss, ref_grads, _ = step(backend, "none", torch.bfloat16)
    loss, grads, applied = step(backend, strategy, torch.bfloat16)
    assert torch.equal(loss, ref_loss)
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name])
    if strategy == "selective_op":
        assert applied.matched_ops


def grads_of(backend: str, strategy: str, dtype: torch.dtype):
    return step(backend, strategy, dtype)[1]


@pytest.mark.parametrize("backend", ["sdpa", "flash_attn"])
def test_gpu_selective_op_with_dropout_matches_none_as_closely_as_none_matches_itself(backend):
    """Dropout 0.1 under selective_op: the attention kernel draws from the CUDA RNG, so it must be recomputed,
    not replayed from a saved output (which would shift every later dropout mask). Bitwise where the backward
    kernels are deterministic; otherwise within the run-to-run difference of the plain model itself."""
    if backend == "flash_attn" and importlib.util.find_spec("flash_attn") is None:
        pytest.skip("flash-attn is not installed")
    dtype = torch.float32 if backend == "sdpa" else torch.bfloat16
    first, second = grads_of(backend, "none", dtype), grads_of(backend, "none", dtype)
    selective = grads_of(backend, "selective_op", dtype)
    for name in first:
        noise = (first[name].float() - second[name].float()).abs().max().item()
        diff = (selective[name].float() - first[name].float()).abs().max().item()
        assert diff <= noise, f"{name}: selective_op differs by {diff}, the plain model by {noise} run to run"
