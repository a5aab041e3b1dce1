"""The GPT model library: backends agree, cards build, the kernel that ran is detected, not assumed."""

import pytest
import torch

from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.models import GPTConfig, build_model, load_card
from pytest_flashckpt.models.attention import (
    BackendUnavailable,
    OpNameRecorder,
    detect_kernel,
    flash_attn_unavailable_reason,
    resolve_backend,
)
from pytest_flashckpt.training import make_batch

SMALL = GPTConfig(vocab_size=97, block_size=64, n_layer=2, n_head=4, n_embd=64)


def _loss_and_grads(backend, config=SMALL, seq_len=48):
    model = build_model(config, backend, seed=7)
    x, y = make_batch(config.vocab_size, 3, seq_len, seed=5, position=0)
    loss = model(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def test_eager_and_sdpa_agree_on_loss_and_every_gradient():
    loss_e, grads_e = _loss_and_grads("eager")
    loss_s, grads_s = _loss_and_grads("sdpa")
    torch.testing.assert_close(loss_s, loss_e, rtol=1e-5, atol=1e-6)
    assert grads_e.keys() == grads_s.keys()
    for name in grads_e:
        torch.testing.assert_close(grads_s[name], grads_e[name], rtol=1e-4, atol=1e-6, msg=name)


def test_same_seed_builds_identical_models_and_batches():
    a, b = build_model(SMALL, "sdpa", seed=3), build_model(SMALL, "eager", seed=3)
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb and torch.equal(pa, pb)
    assert torch.equal(make_batch(97, 2, 8, 1, 4)[0], make_batch(97, 2, 8, 1, 4)[0])
    assert not torch.equal(make_batch(97, 2, 8, 1, 4)[0], make_batch(97, 2, 8, 1, 5)[0])


def test_head_is_tied_and_parameter_names_are_stable():
    model = build_model(SMALL, "sdpa")
    assert model.lm_head.weight is model.wte.weight
    names = set(model.state_dict())
    assert {"wte.weight", "wpe.weight", "blocks.0.attn.c_attn.weight", "blocks.1.mlp.c_proj.bias", "ln_f.weight"} <= names


@pytest.mark.parametrize(
    ("card", "params"),
    [("tiny", 4.2e6), ("gpt2-small", 124.4e6), ("gpt3-125m", 125.2e6), ("gpt3-2.7b", 2.65e9)],
)
def test_cards_build_on_meta_with_expected_size(card, params):
    config = load_card(card)
    model = build_model(config, "sdpa", device="meta")
    counted = sum(p.numel() for p in model.parameters())
    assert counted == config.num_params()
    assert counted == pytest.approx(params, rel=0.01)
    assert all(p.device.type == "meta" for p in model.parameters())


def test_large_card_refuses_cpu_allocation_with_reason():
    with pytest.raises(ValueError, match="too large to allocate on a CPU.*meta"):
        build_model(load_card("gpt3-2.7b"), "sdpa", device="cpu")


@pytest.mark.parametrize(
    ("backend", "expected"), [("sdpa", "sdpa-flash-cpu"), ("eager", "eager")]
)
def test_kernel_is_detected_from_the_ops_that_ran(backend, expected):
    model = build_model(SMALL, backend)
    x, y = make_batch(97, 2, 16, 0, 0)
    with OpNameRecorder() as recorder:
        model(x, y).backward()
    assert detect_kernel(recorder.op_names, backend) == expected


def test_sdpa_with_dropout_on_cpu_is_recorded_as_the_math_path():
    model = build_model(GPTConfig(**{**SMALL.__dict__, "dropout": 0.1}), "sdpa")
    x, y = make_batch(97, 2, 16, 0, 0)
    with OpNameRecorder() as recorder:
        model(x, y).backward()
    assert detect_kernel(recorder.op_names, "sdpa") == "sdpa-math"


def test_flash_attn_is_unavailable_on_cpu_with_a_clear_reason():
    reason = flash_attn_unavailable_reason(torch.device("cpu"), torch.bfloat16)
    assert reason is not None and ("not installed" in reason or "CUDA" in reason)
    with pytest.raises(BackendUnavailable):
        resolve_backend("flash_attn", torch.device("cpu"), torch.bfloat16)
    assert resolve_backend("auto", torch.device("cpu"), torch.float32) == "sdpa"
    with pytest.raises(ValueError, match="valid: auto, flash_attn, sdpa, eager"):
        resolve_backend("xformers", torch.device("cpu"), torch.float32)


def test_bfloat16_model_trains_on_cpu():
    model = build_model(SMALL, "sdpa", dtype=torch.bfloat16)
    x, y = make_batch(97, 2, 16, 0, 0)
    loss = model(x, y)
    loss.backward()
    assert loss.dtype == torch.bfloat16 and torch.isfinite(loss)


def test_card_errors_name_file_key_and_valid_choices(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nn_layers: 4\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: unknown key 'n_layers' \(valid keys: .*n_layer"):
        load_card(str(bad))
    bad.write_text("name: bad\nn_embd: 100\nn_head: 3\n")
    with pytest.raises(ConfigError, match="n_embd \\(100\\) must be divisible by n_head \\(3\\)"):
        load_card(str(bad))
    bad.write_text("name: bad\nn_layer: four\n")
    with pytest.raises(ConfigError, match="n_layer: expected an integer, got str 'four'"):
        load_card(str(bad))
    with pytest.raises(ConfigError, match="unknown model card 'gpt5'.*valid names: .*tiny"):
        load_card("gpt5")
