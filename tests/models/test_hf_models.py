"""Hugging Face models named by their config in a suite: built offline (random init), anatomy discovered for
GPT-2 and Llama, refused with a reason for layouts discovery cannot decide or stated by the user, and run by the
scenario runner; bad input is an error naming the file, scenario and key before anything runs."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.preflight import preflight
from pytest_flashckpt.config.suites import load_suite
from pytest_flashckpt.runner.context import RunContext
from pytest_flashckpt.runner.run import run_scenario

transformers = pytest.importorskip("transformers", reason="Hugging Face models need the optional extra pytest-flashckpt[hf]")

from pytest_flashckpt.models.anatomy import check_block, get_anatomy, get_blocks  # noqa: E402
from pytest_flashckpt.models.hf import build_hf_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 32}
LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 48, "vocab_size": 64, "max_position_embeddings": 32}


def test_gpt2_and_llama_anatomies_are_discovered_and_checked() -> None:
    gpt2 = build_hf_model(GPT2, "sdpa")
    anatomy = get_anatomy(gpt2)
    assert (anatomy.family, anatomy.blocks, anatomy.head) == ("hf-gpt2", "transformer.h", "lm_head")
    assert anatomy.tied == (("lm_head.weight", "transformer.wte.weight"),)
    assert type(get_blocks(gpt2)[0].attn.c_attn).__name__ == "Conv1D"
    llama = build_hf_model(LLAMA, "eager")
    anatomy = get_anatomy(llama)
    assert (anatomy.family, anatomy.blocks, anatomy.embeddings, anatomy.tied) == ("hf-llama", "model.layers", ("model.embed_tokens",), ())
    assert set(anatomy.block.projections) == {"q", "k", "v", "o", "gate", "up", "down"}
    assert llama.config._attn_implementation == "eager"
    tied = build_hf_model({**LLAMA, "tie_word_embeddings": True}, "sdpa")
    assert get_anatomy(tied).tied == (("lm_head.weight", "model.embed_tokens.weight"),)


def test_a_users_own_hf_model_is_discovered_too() -> None:
    config = transformers.AutoConfig.for_model(**GPT2, bos_token_id=None, eos_token_id=None)
    model = transformers.AutoModelForCausalLM.from_config(config)  # built by the user, not by us
    assert get_anatomy(model).family == "hf-gpt2"


def test_the_seed_fixes_the_weights_and_the_training_call_returns_the_loss() -> None:
    a, b = build_hf_model(LLAMA, "sdpa", seed=3), build_hf_model(LLAMA, "sdpa", seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    x = torch.randint(0, 64, (2, 8))
    loss = a(x, x.roll(-1, 1))
    logits = a(input_ids=x).logits  # without targets: transformers' own forward
    assert loss.ndim == 0 and torch.allclose(loss, torch.nn.functional.cross_entropy(logits.flatten(0, 1), x.roll(-1, 1).flatten()))


def test_an_undiscoverable_layout_is_refused_with_what_could_not_be_decided() -> None:
    opt = {"model_type": "opt", "num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "ffn_dim": 64,
           "vocab_size": 64, "word_embed_proj_dim": 32, "max_position_embeddings": 32}
    with pytest.raises(ValueError, match=r"cannot decide the anatomy of a OPTForCausalLM.*model\.decoder\.layers \(1 modules\).*State it in the suite"):
        build_hf_model(opt, "sdpa")
    stated = {"blocks": "model.decoder.layers", "attention": "self_attn", "norms": ["self_attn_layer_norm", "final_layer_norm"],
              "projections": {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
                              "o": "self_attn.out_proj", "up": "fc1", "down": "fc2"},
              "embeddings": ["model.decoder.embed_tokens", "model.decoder.embed_positions"], "head": "lm_head"}
    model = build_hf_model(opt, "sdpa", anatomy=stated)
    anatomy = get_anatomy(model)
    assert anatomy.family == "custom" and anatomy.tied == (("lm_head.weight", "model.decoder.embed_tokens.weight"),)
    check_block(anatomy, get_blocks(model)[0])


def test_a_stated_anatomy_that_does_not_match_names_the_block_and_modules() -> None:
    wrong = {"projections": {"qkv": "attn.c_attn", "up": "mlp.c_fc", "down": "mlp.c_proj"}}  # attn.c_proj has no role
    with pytest.raises(ValueError, match=r"model\.anatomy: transformer\.h\.0 \(GPT2Block\) does not match its anatomy: matmul module\(s\) without a role: attn\.c_proj"):
        build_hf_model(GPT2, "sdpa", anatomy=wrong)


def _suite(tmp_path, monkeypatch, body: str):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(body)
    return load_suite(str(tmp_path / "s.yaml"))


def test_a_config_json_path_is_read_locally(tmp_path, monkeypatch) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "architectures": ["LlamaForCausalLM"]}))
    suite = _suite(tmp_path, monkeypatch, "scenarios:\n  - {name: a, model: {hf: config.json}, seq_len: 16, batch_size: 1, measure: [memory]}\n")
    result = run_scenario(suite.scenarios[0], RunContext(torch.device("cpu"), "cpu"))
    assert result.status == "measured", result.reason
    assert result.metrics["peak_bytes"] > 0


@pytest.mark.parametrize("body, expected", [
    ("{name: a, model: {hf: {n_layer: 2}}}", r"s\.yaml: scenario 'a'.*model\.hf: 'model_type' is required"),
    ("{name: a, model: {hf: missing.json}}", r"scenario 'a'.*model\.hf: 'missing\.json' is not a file"),
    ("{name: a, model: {card: tiny, anatomy: {blocks: h}}}", r"scenario 'a'.*model\.anatomy .*needs model\.hf"),
    ("{name: a, model: {hf: {model_type: gpt2}, anatomy: {block: h}}}", r"model\.anatomy: unknown key\(s\) block; valid: blocks"),
    ("{name: a, model: {card: small, hf: {model_type: gpt2}}}", r"model\.card 'small' and model\.hf name two models"),
])
def test_bad_hf_input_is_named_before_anything_runs(tmp_path, monkeypatch, body: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        _suite(tmp_path, monkeypatch, f"scenarios:\n  - {body}\n")


def test_preflight_checks_sequence_and_k_against_the_config(tmp_path, monkeypatch) -> None:
    suite = _suite(tmp_path, monkeypatch, "scenarios:\n"
                   "  - {name: long, model: {hf: {model_type: gpt2, n_positions: 32}}, seq_len: 64}\n"
                   "  - {name: k, model: {hf: {model_type: gpt2, n_layer: 2}}, seq_len: 16, activation: {strategy: every_k, k: 3}}\n")
    with pytest.raises(ConfigError, match=r"scenario 'long'.*seq_len.*64 exceeds the 32 positions"):
        preflight(suite.scenarios[0], "s.yaml")
    with pytest.raises(ConfigError, match=r"scenario 'k'.*activation\.k.*3 is larger than the 2 layers"):
        preflight(suite.scenarios[1], "s.yaml")


def test_without_transformers_the_scenario_is_skipped_with_the_install_line(monkeypatch) -> None:
    scenario = next(s for s in load_suite("hf").scenarios if s.name == "hf-llama-none")
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    result = run_scenario(scenario, RunContext(torch.device("cpu"), "cpu"))
    assert result.status == "skipped" and "pip install 'pytest-flashckpt[hf]'" in result.reason


def test_the_hf_suite_loads_and_passes_preflight() -> None:
    suite = load_suite("hf")
    families = {s.model.hf["model_type"] for s in suite.scenarios}
    assert families == {"gpt2", "llama"}
    assert {s.card for s in suite.scenarios} == {"hf:gpt2", "hf:llama"}  # the report's card column
    assert all(s.reference().card == s.card for s in suite.scenarios)
    for scenario in suite.scenarios:
        preflight(scenario)
    assert "hf" not in {s.suite for s in load_suite("default").scenarios}
