"""A Hugging Face config is checked before anything is built: the model type builds a causal LM, the heads divide
what they split, NaN and infinity are refused, and its size is counted without building it (one and two layers on
meta, scaled), so the host-memory preflight refuses a billion-layer config at once with the bytes it needs. Each
case has a control: transformers' own behaviour without the check (a traceback, a multi-line error, or a silently
different model), or the count checked against a built model."""

from __future__ import annotations

import json
import time

import pytest
import torch

pytest.importorskip("transformers")
import transformers  # noqa: E402

from pytest_flashckpt.config.errors import ConfigError  # noqa: E402
from pytest_flashckpt.config.cards.llama import LlamaConfig  # noqa: E402
from pytest_flashckpt.config.model_card import load_card  # noqa: E402
from pytest_flashckpt.config.preflight import check_resources, predicted_host_bytes  # noqa: E402
from pytest_flashckpt.config.suites import load_suite  # noqa: E402
from pytest_flashckpt.models.hf.build import HFConfigProblem, build_hf_model, hf_config, parameter_count  # noqa: E402
from pytest_flashckpt.runner.preflight import hf_shape  # noqa: E402

GPT2 = {"model_type": "gpt2", "n_layer": 3, "n_embd": 64, "n_head": 4, "vocab_size": 512, "n_positions": 64}
LLAMA = {"model_type": "llama", "num_hidden_layers": 3, "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 64}


def _one_line(info: pytest.ExceptionInfo) -> str:
    text = str(info.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def _suite(tmp_path, model: str):
    path = tmp_path / "s.yaml"
    path.write_text(f"defaults: {{batch_size: 1, seq_len: 16, measure: [memory]}}\nscenarios:\n  - {{name: a, model: {model}}}\n")
    return load_suite(str(path))


@pytest.mark.slow
@pytest.mark.parametrize(("model_type", "words"), [
    ("llamma", "'llamma' is not a model type in transformers"),
    ("t5", "'t5' is not a causal LM (AutoModelForCausalLM cannot build it)"),
])
def test_a_model_type_that_builds_no_causal_lm_names_the_key_and_known_types(model_type, words):
    with pytest.raises(ValueError):  # control: transformers refuses too, but only once the model is being made
        transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model("t5"))
    with pytest.raises(HFConfigProblem) as info:
        hf_config({"model_type": model_type})
    message = _one_line(info)
    assert message.startswith(f"model.hf.model_type: {words}")
    assert "causal LM types, e.g. gpt2, llama" in message
    if model_type == "llamma":
        assert "did you mean llama" in message


@pytest.mark.parametrize(("spec", "key", "words"), [
    ({**GPT2, "n_head": 3}, "model.hf.n_head", "3 heads do not divide the hidden size 64 (model.hf.n_embd)"),
    ({**LLAMA, "hidden_size": 66}, "model.hf.num_attention_heads", "4 heads do not divide the hidden size 66"),
    ({**LLAMA, "num_key_value_heads": 3}, "model.hf.num_key_value_heads", "3 key/value heads do not divide the 4 attention heads"),
    ({**GPT2, "n_head": 0}, "model.hf.n_head", "0 must be a positive integer"),
])
def test_heads_that_do_not_divide_are_named_before_building(spec, key, words):
    with pytest.raises(HFConfigProblem) as info:
        hf_config(spec)
    assert _one_line(info).startswith(f"{key}: {words}") and info.value.key == key


def test_the_head_controls_fail_or_build_another_model_without_the_check():
    data = {k: v for k, v in GPT2.items() if k != "model_type"}
    with pytest.raises(ValueError, match="divisible"), torch.device("meta"):  # GPT-2: a traceback from the model
        transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model("gpt2", **{**data, "n_head": 3}))
    data = {k: v for k, v in LLAMA.items() if k != "model_type"}
    with torch.device("meta"):  # Llama: builds, with key/value projections of 3 x 16, not a share of 4 heads
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model("llama", **{**data, "num_key_value_heads": 3}))
    assert model.model.layers[0].self_attn.k_proj.out_features == 48


@pytest.mark.parametrize("spec", [GPT2, LLAMA, {**LLAMA, "tie_word_embeddings": True}])
def test_the_parameter_count_is_the_built_models(spec):
    built = build_hf_model(spec, "sdpa", device="meta")
    assert parameter_count(hf_config(spec)) == sum(p.numel() for p in built.parameters())


def test_a_billion_layers_is_refused_by_the_host_preflight_in_well_under_a_second(tmp_path):
    suite = _suite(tmp_path, "{hf: {model_type: gpt2, n_layer: 1000000000, n_embd: 64, n_head: 4, vocab_size: 512}}")
    scenario = suite.scenarios[0]
    hf_shape(scenario, "warm-up")  # transformers' GPT-2 module imported once, as any run would
    started = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        check_resources(suite.scenarios, suite.origin, 64 * 2**30, None, "work", on_cpu=True,
                        shape_of=lambda s: hf_shape(s, suite.origin(s)))
    assert time.perf_counter() - started < 0.5
    message = _one_line(info)
    need = predicted_host_bytes(scenario, hf_shape(scenario, ""))
    assert need > 1000000000 * 12 * 64 * 64 * 4  # at least the layers' matmul weights in fp32
    state = 4 * 4 * parameter_count(hf_config(scenario.model.hf))  # parameters, gradients, AdamW moments in fp32
    assert need > state > 64 * 2**30
    assert "s.yaml: scenario 'a': model.hf: 'hf:gpt2' has " in message and " parameters: with their gradients" in message
    assert "more than this machine's 64.0 GiB (use a smaller model (fewer or narrower layers), or simulate: {enabled: true})" in message
    # control: without a shape for the Hugging Face scenario (the old preflight), nothing is refused
    check_resources(suite.scenarios, suite.origin, 64 * 2**30, None, "work", on_cpu=True)


def test_building_a_model_larger_than_the_host_is_refused_before_any_module():
    with pytest.raises(HFConfigProblem) as info:
        build_hf_model({**GPT2, "n_layer": 1000000000}, "sdpa")
    message = _one_line(info)
    assert message.startswith("model.hf: ") and "(model.hf.n_layer 1,000,000,000) need" in message
    assert "bytes in float32 alone, more than the" in message


def test_a_bad_config_in_the_preflight_names_file_scenario_and_key(tmp_path):
    suite = _suite(tmp_path, "{hf: {model_type: gpt2, n_embd: 64, n_head: 3}}")
    with pytest.raises(ConfigError) as info:
        hf_shape(suite.scenarios[0], suite.origin(suite.scenarios[0]))
    assert "s.yaml: scenario 'a': model.hf.n_head: 3 heads do not divide" in _one_line(info)


# -- NaN and infinity ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("model", "words"), [
    ("{hf: {model_type: gpt2, layer_norm_epsilon: .nan}}", "model.hf.layer_norm_epsilon: nan is not a finite number"),
    ("{hf: config.json}", "model.hf.rope_theta: inf in "),
    ("{card: tiny, dropout: -.inf}", "model.dropout: -inf is not a finite number"),
])
def test_nan_and_infinity_in_a_suite_or_config_name_the_key(tmp_path, monkeypatch, model, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "llama", "rope_theta": Infinity}')
    assert json.loads((tmp_path / "config.json").read_text())["rope_theta"] == float("inf")  # control: json takes it
    with pytest.raises(ConfigError) as info:
        _suite(tmp_path, model)
    assert words in _one_line(info)


def test_nan_in_a_card_names_the_key_where_the_range_check_lets_it_through(tmp_path):
    assert LlamaConfig(rope_theta=float("nan")).rope_theta != 0  # control: 'rope_theta <= 0' is false for NaN
    (tmp_path / "c.yaml").write_text("family: llama\nrope_theta: .nan\n")
    with pytest.raises(ConfigError) as info:
        load_card(str(tmp_path / "c.yaml"))
    assert "c.yaml: rope_theta: nan is not a finite number" in _one_line(info)
