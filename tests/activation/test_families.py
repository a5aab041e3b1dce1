"""Every activation strategy on the Llama family, by anatomy: bitwise loss and gradients against no
checkpointing, closed-form FLOPs, and an error (never a silent mislabel) for a block that does not match."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.activation.expected_flops import expected_matmul_flops
from pytest_flashckpt.activation.flops import measure_step_flops
from pytest_flashckpt.activation.policy import UnlabelledMatmul
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.models import build_model, load_card
from pytest_flashckpt.training import make_batch

# odd sizes: 3 query heads per KV head, an MLP width that is no multiple of the model width
CARD = load_card("llama-tiny", vocab_size=96, block_size=64, n_embd=48, n_head=6, n_kv_head=2, intermediate_size=76)


def step(card, backend: str, activation: ActivationConfig):
    model = build_model(card, backend)
    applied = apply_ac(model, activation, shape=(2, 24))
    x, y = make_batch(card.vocab_size, 2, 24, seed=1, position=0)
    loss = model(x, y)
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}, applied


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize(
    "activation",
    [ActivationConfig(strategy="full"), ActivationConfig(strategy="every_k", k=2), ActivationConfig(strategy="selective_op"),
     ActivationConfig(strategy="budget", budget="min + 40%")],
    ids=lambda a: a.strategy,
)
def test_llama_loss_and_every_gradient_bitwise_equal_to_none(activation, backend):
    ref_loss, ref_grads, _ = step(CARD, backend, ActivationConfig())
    loss, grads, applied = step(CARD, backend, activation)
    assert torch.equal(loss, ref_loss)
    unequal = [name for name in grads if not torch.equal(grads[name], ref_grads[name])]
    assert not unequal, f"gradients differ from none: {unequal}"
    assert applied.blocks == ((0, 2) if activation.strategy == "every_k" else (0, 1, 2))


def test_selective_op_recomputes_the_o_and_down_projections_by_role():
    """Seven Linears per block, numbered by nobody: the o projection (the 4th in forward order, where GPT's
    recomputed one is the 2nd) and down (the last, which the replay skips) are recomputed; every other matmul and
    the attention kernel are saved."""
    model = build_model(CARD, "sdpa")
    applied = apply_ac(model, ActivationConfig(strategy="selective_op"))
    measured = measure_step_flops(model, 2, 24)
    assert measured.matmul_flops == expected_matmul_flops(CARD, 2, 24, "selective_op")  # the plan recomputes "o" and "down"
    assert applied.matched_ops["aten.mm.default"] == 7 * CARD.n_layer
    assert applied.matched_ops["aten._scaled_dot_product_flash_attention_for_cpu.default"] == CARD.n_layer


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("strategy", ["none", "full", "every_k"])
def test_llama_step_flops_equal_the_closed_form(strategy, backend):
    model = build_model(CARD, backend)
    apply_ac(model, ActivationConfig(strategy=strategy, k=2))
    measured = measure_step_flops(model, 2, 24).matmul_flops
    assert measured == expected_matmul_flops(CARD, 2, 24, strategy, 2, fused_attention=backend == "sdpa")


def test_a_linear_without_a_role_is_an_error_naming_the_block():
    model = build_model(CARD, "sdpa")
    model.blocks[2].mlp.extra = nn.Linear(4, 4, bias=False)
    for strategy in ("full", "selective_op", "budget"):
        with pytest.raises(ValueError, match=r"blocks\.2 \(Block\) does not match its anatomy.*without a role: mlp\.extra"):
            apply_ac(model, ActivationConfig(strategy=strategy, budget="min + 40%" if strategy == "budget" else None), shape=(2, 24))


def test_a_matmul_outside_every_projection_is_an_error_at_the_first_forward():
    """A functional linear on a raw weight has no module, so only running it can show it: the selective policy
    refuses to guess its role."""
    model = build_model(CARD, "sdpa")
    mlp = model.blocks[1].mlp
    mlp.scale = nn.Parameter(torch.eye(CARD.n_embd))
    plain = mlp.forward
    mlp.forward = lambda x: F.linear(plain(x), mlp.scale)
    apply_ac(model, ActivationConfig(strategy="selective_op"))
    x, y = make_batch(CARD.vocab_size, 2, 24, seed=1, position=0)
    with pytest.raises(UnlabelledMatmul, match=r"blocks\.1 ran aten\.mm\.default outside every projection"):
        model(x, y)


def test_offload_needs_a_gpu():
    from pytest_flashckpt.activation import StrategyUnavailable

    with pytest.raises(StrategyUnavailable, match="nothing to offload"):
        apply_ac(build_model(CARD, "sdpa"), ActivationConfig(strategy="offload"))
