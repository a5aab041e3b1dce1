"""Every activation strategy on the MoE family, by anatomy (router and experts as roles): bitwise loss and
gradients against no checkpointing, the matmul FLOPs counted equal to the closed form from active parameters,
every expert matmul labelled under selective_op, and the layer-wise save resuming bitwise."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.activation.flops import measure_step_flops
from pytest_flashckpt.checkpoint import Checkpointer, resume_latest
from pytest_flashckpt.checkpoint.state import capture
from pytest_flashckpt.config.scenario import ActivationConfig, SaveConfig
from pytest_flashckpt.models import build_model, load_card
from pytest_flashckpt.activation.expected_flops import expected_matmul_flops
from pytest_flashckpt.training import Trainer, make_batch

# small and odd: 3 layers (every_k skips one), 5 experts with 2 per token, a gated shared expert, q/k/v biases
CARD = load_card("moe-tiny", vocab_size=96, block_size=64, n_layer=3, n_embd=48, n_head=6, n_kv_head=2, n_experts=5,
                 expert_intermediate_size=20, shared_expert_intermediate_size=28, capacity_factor=2.0)
VARIANTS = {
    "qwen-like": CARD,
    "capacity": replace(CARD, routing="capacity"),
    "ungated-shared": replace(CARD, shared_expert_gate=False),
    "mixtral-like": replace(CARD, shared_expert_gate=False, shared_expert_intermediate_size=0, norm_topk_prob=True,
                            qkv_bias=False),
}


def step(card, activation: ActivationConfig):
    model = build_model(card, "sdpa")
    applied = apply_ac(model, activation, shape=(2, 24))
    x, y = make_batch(card.vocab_size, 2, 24, seed=1, position=0)
    loss = model(x, y)
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}, applied


@pytest.mark.parametrize(
    "activation",
    [ActivationConfig(strategy="full"), ActivationConfig(strategy="every_k", k=2), ActivationConfig(strategy="selective_op"),
     pytest.param(ActivationConfig(strategy="budget", budget="min + 40%"), marks=pytest.mark.slow)],
    ids=lambda a: a.strategy,
)
def test_moe_loss_and_every_gradient_bitwise_equal_to_none(activation):
    ref_loss, ref_grads, _ = step(CARD, ActivationConfig())
    loss, grads, applied = step(CARD, activation)
    assert torch.equal(loss, ref_loss)
    unequal = [name for name in grads if not torch.equal(grads[name], ref_grads[name])]
    assert not unequal, f"gradients differ from none: {unequal}"
    assert all(ref_grads[f"blocks.0.mlp.experts.{e}.down_proj.weight"].abs().sum() > 0 for e in range(CARD.n_experts))
    assert ref_grads["blocks.0.mlp.gate.weight"].abs().sum() > 0  # the router is trained under forced routing
    assert applied.blocks == ((0, 2) if activation.strategy == "every_k" else (0, 1, 2))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "variant"),
    [*((s, "qwen-like") for s in ("none", "full", "every_k", "selective_op")), ("none", "capacity"),
     ("full", "ungated-shared"), ("full", "mixtral-like"), ("selective_op", "mixtral-like")],
)
def test_moe_step_flops_equal_the_closed_form_from_active_parameters(strategy, variant):
    card = VARIANTS[variant]
    model = build_model(card, "sdpa")
    apply_ac(model, ActivationConfig(strategy=strategy, k=2))
    measured = measure_step_flops(model, 2, 24).matmul_flops
    assert measured == expected_matmul_flops(card, 2, 24, strategy, 2)


def test_forward_flops_are_six_per_active_weight_and_token_plus_attention():
    """The control on the closed form: a step's Linear FLOPs are 6 x (active parameters without norms, biases and
    the embedding table) x tokens, the textbook count, and attention's 4*B*T^2*C forward (x3.5: the fused kernel's
    backward recomputes the scores)."""
    card = VARIANTS["mixtral-like"]
    B, T, C = 2, 24, card.n_embd
    active_matmul_weights = card.active_params() - card.vocab_size * C - (2 * card.n_layer + 1) * C
    attention = card.n_layer * 4 * B * T * T * C * 7 // 2
    assert expected_matmul_flops(card, B, T) == 6 * B * T * active_matmul_weights + attention


def test_selective_op_labels_every_expert_matmul_by_role():
    """q/k/v with biases run addmm; o, router, each expert's gate/up/down, the shared expert and its gate run mm:
    all labelled (an unlabelled one is an error), all saved but o."""
    model = build_model(CARD, "sdpa")
    applied = apply_ac(model, ActivationConfig(strategy="selective_op"))
    measure_step_flops(model, 2, 24)
    assert applied.matched_ops["aten.addmm.default"] == 3 * CARD.n_layer
    assert applied.matched_ops["aten.mm.default"] == (1 + 1 + 3 * CARD.n_experts + 3 + 1) * CARD.n_layer


def test_layerwise_save_follows_the_anatomy_and_resumes_bitwise(tmp_path):
    def make(seed: int = 0) -> Trainer:
        return Trainer.create(build_model(replace(CARD, n_layer=2), "sdpa", seed=seed), batch_size=2, seq_len=16, seed=0)

    straight = make()
    for _ in range(3):
        straight.train_step()
    first = make()
    with Checkpointer(tmp_path, SaveConfig(strategy="layerwise", format="safetensors")) as ckpt:
        first.train_step()
        ckpt.save(first)
        first.train_step()
        record = ckpt.save(first)
    files = sorted(p.name for p in (tmp_path / record.name / "layers").iterdir())
    assert files == ["block_000.safetensors", "block_001.safetensors", "rest.safetensors"]
    resumed = make(seed=1)
    resume_latest(resumed, tmp_path)
    resumed.train_step()
    a, b = capture(resumed).tensors, capture(straight).tensors
    assert [k for k in b if not k.startswith("rng/") and not torch.equal(a[k], b[k])] == []
