"""Hugging Face configs in the simulator: the step of a transformers model built on meta by the builder measured
runs use (``models.hf.build``), its attention one explicit kernel op registered with transformers' attention
interface (``models.hf.attention``). On a CPU target the simulated peak equals the cpu probe's measured peak of the
same real step to the byte (GPT-2, Llama, Qwen2, Mistral); on a CUDA target a Hugging Face Llama keeps exactly the
project's Llama card's per-block bytes (the flash op's saved tensors), and every peak difference is named and
sized; a config the simulator cannot take is refused as not supported, never as a card-schema typo."""

from __future__ import annotations

import json
import re

import pytest
import torch

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.cli import main
from pytest_flashckpt.config.cards.llama import LlamaConfig
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.probes.cpu import LiveTensorProbe
from pytest_flashckpt.simulate import simulate_step
from pytest_flashckpt.training import Trainer

pytest.importorskip("transformers", reason="Hugging Face models need the optional extra pytest-flashckpt[hf]")

from pytest_flashckpt.models.hf import build_hf_model  # noqa: E402
from pytest_flashckpt.models.hf.card import hf_card  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

LLAMA_SHAPE = {"num_hidden_layers": 2, "hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 2,
               "intermediate_size": 80, "vocab_size": 101, "max_position_embeddings": 64}  # odd sizes, 3 heads per KV head
CONFIGS = {
    "gpt2": {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 64},
    "llama": {"model_type": "llama", **LLAMA_SHAPE},
    "qwen2": {"model_type": "qwen2", **LLAMA_SHAPE},  # q/k/v biases
    "mistral": {"model_type": "mistral", **LLAMA_SHAPE, "sliding_window": 64},
}
BATCH, SEQ = 2, 32


def measured_cpu_peak(spec: dict, strategy: str, dropout: float | None) -> tuple[int, int]:
    """(peak, start) bytes of the real CPU step's second step, as the runner measures it."""
    model = build_hf_model(spec, "sdpa", "cpu", torch.float32, dropout=dropout)
    if strategy != "none":
        apply_ac(model, ActivationConfig(strategy=strategy), shape=(BATCH, SEQ))
    trainer = Trainer.create(model, BATCH, SEQ)
    trainer.train_step()
    with LiveTensorProbe().track(trainer.state_tensors()) as reading:
        trainer.train_step()
    return reading.peak_bytes, reading.start_bytes


DEFAULT_CASES = {("gpt2", "none"), ("llama", "selective_op"), ("qwen2", "none"), ("mistral", "none")}  # the rest: slow


@pytest.mark.parametrize(("family", "strategy", "dropout"), [
    *(pytest.param(family, strategy, 0.0, marks=() if (family, strategy) in DEFAULT_CASES else pytest.mark.slow)
      for family in CONFIGS for strategy in ("none", "selective_op")),
    # llama full runs by default in the suite-scenario test below
    pytest.param("llama", "full", 0.0, marks=pytest.mark.slow), pytest.param("llama", "every_k", 0.0, marks=pytest.mark.slow),
    ("gpt2", "none", None),  # GPT-2's own dropout 0.1: SDPA takes its math path on a CPU, and on meta alike
])
def test_hf_config_simulated_equals_measured_on_cpu(family, strategy, dropout) -> None:
    spec = CONFIGS[family]
    peak, start = measured_cpu_peak(spec, strategy, dropout)
    sim = simulate_step(hf_card(spec, dropout), "float32", BATCH, SEQ, "sdpa", strategy, target="cpu")
    assert (sim.peak_bytes, sim.start_bytes) == (peak, start)
    assert sim.kernel == ("sdpa" if dropout is None else "sdpa-flash-cpu")
    assert len(sim.block_kept_bytes) == 2 and sum(sim.breakdown.values()) == sim.peak_bytes


def test_a_control_a_wrong_card_is_not_equal() -> None:
    """The equality above can fail: one more layer in the simulated config moves the peak."""
    peak, _ = measured_cpu_peak(CONFIGS["llama"], "none", 0.0)
    sim = simulate_step(hf_card({**CONFIGS["llama"], "num_hidden_layers": 3}), "float32", BATCH, SEQ, "sdpa", "none", target="cpu")
    assert sim.peak_bytes != peak


CARD = LlamaConfig(name="llama-small", vocab_size=256, block_size=256, n_layer=2, n_head=4, n_kv_head=2, n_embd=64,
                   intermediate_size=96, rope_theta=500000.0, norm_eps=1e-5)
HF_OF_CARD = {"model_type": "llama", "vocab_size": 256, "max_position_embeddings": 256, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64, "intermediate_size": 96,
              "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}


@pytest.mark.parametrize(("dtype", "kernel", "strategy"), [
    ("bf16", "flash", "none"), pytest.param("fp32", "efficient", "none", marks=pytest.mark.slow), ("fp32", "efficient", "full")])
def test_a_cuda_prediction_of_an_hf_llama_equals_the_llama_card_but_for_named_differences(dtype, kernel, strategy) -> None:
    """Same shape, target cuda: every block keeps the same bytes (the flash / mem-efficient op's saved tensors, not
    SDPA's math path: that would keep T x T scores per head), and the peaks differ by exactly what the two models do
    differently outside the kernel:

    - transformers' rotary tables: ``inv_freq`` and ``original_inv_freq`` buffers (head_dim / 2 values each);
    - the loss: the Hugging Face step takes the cross-entropy of float32 logits (as transformers' own loss), the
      card's model of logits in the compute dtype; in bf16 that keeps a float32 log-softmax (+2 B per logit) and
      makes float32 gradients in the backward (+4 B per logit), and the loss and its gradient are float32 scalars
      (+2 B each);
    - with checkpointing, the (1, T) int64 ``position_ids`` transformers builds, which each checkpointed layer is
      given as an input and so keeps.
    """
    card = simulate_step(CARD, dtype, BATCH, 128, kernel, strategy)
    hf = simulate_step(hf_card(HF_OF_CARD), dtype, BATCH, 128, kernel, strategy)
    assert hf.block_kept_bytes == card.block_kept_bytes
    itemsize = 2 if dtype == "bf16" else 4
    rotary_buffers = 2 * (CARD.head_dim // 2) * itemsize
    logits = BATCH * 128 * CARD.vocab_size
    float32_loss = (2 + 4) * logits + 2 * 2 if dtype == "bf16" else 0
    position_ids = 128 * 8 if strategy != "none" else 0
    assert hf.peak_op == card.peak_op and hf.peak_phase == card.peak_phase
    assert hf.peak_bytes - card.peak_bytes == rotary_buffers + float32_loss + position_ids
    assert hf.breakdown["parameters"] - card.breakdown["parameters"] == rotary_buffers  # (buffers count as resident)


def test_the_meta_attention_is_the_explicit_kernel_op() -> None:
    """A model built for the simulator runs the flash op on meta (no T x T scores), registered with transformers."""
    from transformers import AttentionInterface

    from pytest_flashckpt.simulate.workload import simulated_model

    model = simulated_model(hf_card(CONFIGS["llama"]), "bfloat16", "flash", "cuda")
    assert model.config._attn_implementation == "meta_kernel_cuda_fa2" and "meta_kernel_cuda_fa2" in AttentionInterface()
    seen: set[str] = set()
    from torch.utils._python_dispatch import TorchDispatchMode

    class Names(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(str(func.name()))
            return func(*args, **(kwargs or {}))

    tokens = torch.empty((1, 16), dtype=torch.int64, device="meta")
    with Names():
        model(tokens, tokens).backward()
    assert {"aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_flash_attention_backward"} <= seen
    assert not any("softmax" in name and "log" not in name for name in seen)  # no math-path softmax over scores


def test_a_sliding_window_shorter_than_the_sequence_is_refused() -> None:
    with pytest.raises(ValueError, match=r"sliding_window 16 is shorter than the sequence 32.*sliding_window: null"):
        simulate_step(hf_card({**CONFIGS["mistral"], "sliding_window": 16}), "bf16", 1, 32, "flash", "none")


def test_cli_simulates_a_config_json(tmp_path, capsys) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIGS["llama"], "attention_bias": False, "architectures": ["LlamaForCausalLM"]}))
    assert main(["simulate", "--hf-config", str(path), "--seq", "32", "--batch", "2", "--device-memory", "1GiB"]) == 0
    out = capsys.readouterr().out
    assert "hf:config.json, bf16, batch 2 x seq 32, attention sdpa-flash (cuda)" in out and "fits (headroom" in out
    assert main(["simulate", "--model", str(path), "--seq", "32", "--batch", "2"]) == 0  # a config.json given as --model
    assert "hf:config.json" in capsys.readouterr().out


@pytest.mark.parametrize(("config", "message"), [
    ({"model_type": "opt", "num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "ffn_dim": 64,
      "vocab_size": 64, "word_embed_proj_dim": 32, "max_position_embeddings": 32},
     r"--hf-config .*config\.json: model_type 'opt' is not supported: the simulator and FSDP ranks take the gpt2 "
     r"\(transformer\.h blocks\), llama \(model\.layers blocks\) layouts .*state its anatomy"),
    ({"model_type": "llamma"}, r"'llamma' is not a model type .*did you mean llama"),
    ({**CONFIGS["llama"], "num_attention_heads": 5}, r"num_attention_heads: 5 heads do not divide the hidden size 48"),
    ({**CONFIGS["llama"], "max_position_embeddings": 16}, r"longer than the 16 positions of Hugging Face config 'hf:config.json'"),
])
def test_cli_refuses_a_config_it_cannot_take_saying_why(tmp_path, capsys, config, message) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["simulate", "--hf-config", str(path), "--seq", "32", "--batch", "2"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "unknown key" not in err
    assert re.search(message, err), err


def test_a_suite_scenario_of_an_hf_config_is_simulated_as_it_is_measured() -> None:
    """``model: {hf: ...}`` with ``simulate: {enabled: true}``: the runner's simulated peak is the measured one, its
    saving is against the simulated reference, and no GPT formula is applied to a Hugging Face model."""
    from pytest_flashckpt.config.scenario import ModelSpec, Scenario, SimulateConfig
    from pytest_flashckpt.runner.context import RunContext
    from pytest_flashckpt.runner.runners import measure_scenario

    scenario = Scenario("hf-llama-full", model=ModelSpec(hf=CONFIGS["llama"], dropout=0.0), suite="t", dtype="float32",
                        batch_size=BATCH, seq_len=SEQ, activation=ActivationConfig(strategy="full"),
                        simulate=SimulateConfig(enabled=True, kernel="sdpa", target="cpu"))
    result = measure_scenario(scenario, RunContext(torch.device("cpu"), "cpu"))
    assert result.status == "measured", result.reason
    m = result.metrics
    assert m["simulated_peak_bytes"] == measured_cpu_peak(CONFIGS["llama"], "full", 0.0)[0]
    assert m["simulated_reference_peak_bytes"] == measured_cpu_peak(CONFIGS["llama"], "none", 0.0)[0]
    assert "analytic_peak_bytes" not in m and result.kernel == "sdpa-flash-cpu"
