"""apply_ac: each strategy is applied as configured, keeps parameter names, and is bitwise equivalent to none."""

from __future__ import annotations

import re

import pytest
import torch

from pytest_flashckpt.activation import DEFAULT_SAVE_OPS, StrategyUnavailable, apply_ac
from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.config.typed import build
from pytest_flashckpt.core.registry import ACTIVATION_STRATEGIES
from pytest_flashckpt.models import GPTConfig, build_model
from pytest_flashckpt.training import make_batch

CPU_STRATEGIES = ("full", "every_k", "selective_op")


def small(dropout: float = 0.0, n_layer: int = 3) -> GPTConfig:
    return GPTConfig(vocab_size=64, block_size=64, n_layer=n_layer, n_head=2, n_embd=32, dropout=dropout)


def step(config: GPTConfig, backend: str, activation: ActivationConfig):
    """One seeded forward + backward; returns the loss, the gradients by name and what apply_ac recorded."""
    model = build_model(config, backend)
    applied = apply_ac(model, activation)
    x, y = make_batch(config.vocab_size, 2, 32, seed=1, position=0)
    torch.manual_seed(0)
    loss = model(x, y)
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}, applied


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("strategy", CPU_STRATEGIES)
def test_loss_and_every_gradient_bitwise_equal_to_none(strategy, backend, dropout):
    config = small(dropout)
    ref_loss, ref_grads, _ = step(config, backend, ActivationConfig())
    loss, grads, _ = step(config, backend, ActivationConfig(strategy=strategy, k=2))
    assert torch.equal(loss, ref_loss)
    assert grads.keys() == ref_grads.keys()
    unequal = [name for name in grads if not torch.equal(grads[name], ref_grads[name])]
    assert not unequal, f"gradients differ from none: {unequal}"


@pytest.mark.parametrize("strategy", ("none", *CPU_STRATEGIES))
def test_parameter_names_unchanged(strategy):
    plain = build_model(small(), "sdpa")
    model = build_model(small(), "sdpa")
    apply_ac(model, ActivationConfig(strategy=strategy, k=2))
    assert list(model.state_dict()) == list(plain.state_dict())
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in plain.named_parameters()]
    model.load_state_dict(plain.state_dict())  # strict: checkpoints of the plain model load as they are


@pytest.mark.parametrize(
    ("strategy", "k", "blocks"),
    [("none", 2, ()), ("full", 2, (0, 1, 2, 3)), ("every_k", 2, (0, 2)), ("every_k", 3, (0, 3)), ("every_k", 4, (0,))],
)
def test_applied_blocks(strategy, k, blocks):
    model = build_model(small(n_layer=4), "sdpa")
    applied = apply_ac(model, ActivationConfig(strategy=strategy, k=k))
    assert applied.strategy == strategy
    assert applied.blocks == blocks


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_selective_records_matched_ops(backend):
    *_, applied = step(small(), backend, ActivationConfig(strategy="selective_op"))
    assert applied.save_ops[: len(DEFAULT_SAVE_OPS)] == DEFAULT_SAVE_OPS
    assert applied.matched_ops["aten.addmm.default"] == 4 * 3  # four Linears per block
    if backend == "sdpa":
        assert applied.matched_ops["aten._scaled_dot_product_flash_attention_for_cpu.default"] == 3
    else:
        assert applied.matched_ops["aten.bmm.default"] == 2 * 3  # scores and weighted values
    assert applied.to_dict()["matched_ops"] == applied.matched_ops


def test_default_save_list_covers_every_sdpa_kernel():
    kernels = {
        "aten._scaled_dot_product_flash_attention_for_cpu.default",
        "aten._scaled_dot_product_flash_attention.default",
        "aten._scaled_dot_product_efficient_attention.default",
        "aten._scaled_dot_product_cudnn_attention.default",
    }
    assert kernels <= set(DEFAULT_SAVE_OPS)
    assert {"aten.mm.default", "aten.addmm.default", "aten.bmm.default"} <= set(DEFAULT_SAVE_OPS)


def test_explicit_save_list_is_used_and_stays_equivalent():
    ops = ("aten.addmm.default",)
    ref_loss, ref_grads, _ = step(small(), "sdpa", ActivationConfig())
    loss, grads, applied = step(small(), "sdpa", ActivationConfig(strategy="selective_op", save_ops=ops))
    assert applied.save_ops == ops
    assert applied.matched_ops == {"aten.addmm.default": 12}
    assert torch.equal(loss, ref_loss) and all(torch.equal(grads[n], ref_grads[n]) for n in grads)


def test_save_list_that_matches_nothing_raises_at_the_first_forward():
    only_cuda = ("aten._scaled_dot_product_efficient_attention.default",)
    with pytest.raises(RuntimeError, match="none of the configured save ops ran.*Ops that ran: .*addmm"):
        step(small(), "sdpa", ActivationConfig(strategy="selective_op", save_ops=only_cuda))


def test_no_grad_forward_does_not_trip_the_match_check():
    model = build_model(small(), "sdpa")
    apply_ac(model, ActivationConfig(strategy="selective_op", save_ops=("aten._scaled_dot_product_efficient_attention.default",)))
    x, _ = make_batch(64, 2, 32, seed=1, position=0)
    with torch.no_grad():
        model(x)


# --- bad input -------------------------------------------------------------------------------------------------


def test_unknown_strategy_is_rejected_by_config_typing():
    valid = re.escape(", ".join(ACTIVATION_STRATEGIES))  # the registry's names, in its order
    with pytest.raises(ConfigError, match=rf"'gradient' is not a valid choice.*valid: {valid}"):
        build(ActivationConfig, {"strategy": "gradient"}, where="suite.yaml", path="activation")


def test_non_positive_k_is_rejected_by_config():
    with pytest.raises(ValueError, match="activation.k must be a positive number of blocks, got 0"):
        ActivationConfig(strategy="every_k", k=0)


def test_k_larger_than_model_names_k_n_layer_and_range():
    model = build_model(small(n_layer=3), "sdpa")
    with pytest.raises(ValueError, match=r"every_k: k=4 is outside the valid range 1\.\.3 "):
        apply_ac(model, ActivationConfig(strategy="every_k", k=4))


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("aten.not_an_op.default", "there is no operator aten.not_an_op in torch.ops"),
        ("aten.mm.nope", "aten.mm has no overload 'nope'; valid: .*aten.mm.default"),
        ("aten.mm", "is not a full overload name"),
        ("nonexistent_namespace.mm.default", "there is no operator nonexistent_namespace.mm"),
    ],
)
def test_bad_save_op_names(name, message):
    model = build_model(small(), "sdpa")
    with pytest.raises(ValueError, match=message):
        apply_ac(model, ActivationConfig(strategy="selective_op", save_ops=("aten.mm.default", name)))


def test_empty_save_list_is_an_error():
    with pytest.raises(ValueError, match="save_ops is empty"):
        apply_ac(build_model(small(), "sdpa"), ActivationConfig(strategy="selective_op", save_ops=()))


def test_offload_on_cpu_is_unavailable_with_a_reason():
    with pytest.raises(StrategyUnavailable) as info:
        apply_ac(build_model(small(), "sdpa"), ActivationConfig(strategy="offload"))
    assert info.value.reason == (
        "offload moves activations from GPU to CPU memory; on a CPU run there is nothing to offload"
    )


def test_applying_twice_is_an_error():
    model = build_model(small(), "sdpa")
    apply_ac(model, ActivationConfig(strategy="full"))
    with pytest.raises(RuntimeError, match="already applied"):
        apply_ac(model, ActivationConfig(strategy="every_k"))
