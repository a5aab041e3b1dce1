"""Every activation strategy a CPU runs, on Hugging Face GPT-2 (Conv1D, dropout 0.1) and Llama (GQA, SwiGLU,
rotary tables passed to each layer as keyword arguments), through the anatomy: bitwise loss and gradients vs no
checkpointing for full / every_k / selective_op, the budget plan's peak under its budget, FLOPs counted; a block
that does not match its anatomy is an error naming it, not a plan."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

pytest.importorskip("transformers", reason="Hugging Face models need the optional extra pytest-flashckpt[hf]")

from pytest_flashckpt.activation import apply_ac  # noqa: E402
from pytest_flashckpt.activation.budget import MeasuredCosts  # noqa: E402
from pytest_flashckpt.activation.flops import count_step_flops  # noqa: E402
from pytest_flashckpt.config.scenario import ActivationConfig  # noqa: E402
from pytest_flashckpt.models.hf import build_hf_model  # noqa: E402
from pytest_flashckpt.probes.cpu import LiveTensorProbe  # noqa: E402
from pytest_flashckpt.training import Trainer, make_batch  # noqa: E402

HF = {
    "gpt2": {"model_type": "gpt2", "n_layer": 3, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 64},
    "llama": {"model_type": "llama", "num_hidden_layers": 3, "hidden_size": 32, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 48, "vocab_size": 64, "max_position_embeddings": 64},
}
SHAPE = (2, 32)


pytestmark = pytest.mark.usefixtures("one_thread")


def step(model: nn.Module):
    model.train()
    x, y = make_batch(64, *SHAPE, seed=3, position=0)
    torch.manual_seed(7)
    loss = model(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("strategy", ["full", "every_k", "selective_op"])
@pytest.mark.parametrize("family", sorted(HF))
def test_loss_and_gradients_bitwise_equal_to_none(family: str, strategy: str) -> None:
    ref_loss, ref_grads = step(build_hf_model(HF[family], "sdpa"))
    model = build_hf_model(HF[family], "sdpa")
    applied = apply_ac(model, ActivationConfig(strategy=strategy, k=2))
    assert applied.blocks == ((0, 2) if strategy == "every_k" else (0, 1, 2))
    loss, grads = step(model)
    assert torch.equal(loss, ref_loss)
    assert grads.keys() == ref_grads.keys()
    assert [n for n in grads if not torch.equal(grads[n], ref_grads[n])] == []


def peak(trainer: Trainer) -> int:
    with LiveTensorProbe().track(trainer.state_tensors()) as reading:
        trainer.train_step()
    return reading.peak_bytes


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(HF))
def test_budget_plan_stays_under_its_budget(family: str) -> None:
    reference = Trainer.create(build_hf_model(HF[family], "sdpa"), *SHAPE)
    reference.train_step()
    none_peak = peak(reference)
    model = build_hf_model(HF[family], "sdpa")
    source = MeasuredCosts(model, pointwise_weight=50.0)  # costs measured on a private copy of this very model
    applied = apply_ac(model, ActivationConfig(strategy="budget", budget="min + 50%"), shape=SHAPE, source=source)
    plan = applied.plans[SHAPE]
    assert plan.min_peak < plan.budget_bytes < plan.none_peak
    trainer = Trainer.create(model, *SHAPE)
    trainer.train_step()
    measured = peak(trainer)
    assert measured <= plan.budget_bytes < none_peak


@pytest.mark.parametrize("family", sorted(HF))
def test_full_recomputation_counts_more_flops(family: str) -> None:
    plain = Trainer.create(build_hf_model(HF[family], "sdpa"), *SHAPE)
    model = build_hf_model(HF[family], "sdpa")
    apply_ac(model, ActivationConfig(strategy="full"))
    full = Trainer.create(model, *SHAPE)
    assert count_step_flops(full) > count_step_flops(plain) > 0


def test_a_block_that_does_not_match_its_anatomy_is_an_error_not_a_plan() -> None:
    model = build_hf_model(HF["llama"], "sdpa")
    model.model.layers[1].mlp.extra_proj = nn.Linear(32, 32)  # a matmul the anatomy gives no role
    for config in (ActivationConfig(strategy="selective_op"), ActivationConfig(strategy="budget", budget=0.8)):
        with pytest.raises(ValueError, match=r"model\.layers\.1 \(LlamaDecoderLayer\) does not match its anatomy.*mlp\.extra_proj"):
            apply_ac(model, config, shape=SHAPE)
