"""A suite's ``anatomy:`` for a Hugging Face model is held to the model: each value has its key's form (checked
when the suite is read), the blocks are a list of modules, and each projection's shapes fit its role (q/k/v,
gate and up read the hidden size, o and down write it, down reads what up writes, ...), checked on the first
layer built on meta before anything runs. Controls: without the shape check a swapped anatomy builds and labels
every matmul wrongly; without the form check a bad value is a traceback or is taken silently."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from pytest_flashckpt.config.errors import ConfigError  # noqa: E402
from pytest_flashckpt.config.suites import load_suite  # noqa: E402
from pytest_flashckpt.models.hf import build  # noqa: E402
from pytest_flashckpt.models.hf.anatomy import stated_anatomy  # noqa: E402
from pytest_flashckpt.models.hf.build import HFConfigProblem, build_hf_model, check_anatomy, hf_config  # noqa: E402
from pytest_flashckpt.runner.preflight import hf_shape  # noqa: E402

LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 64}
ROLES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
         "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}


def _swapped(a: str, b: str) -> dict:
    return {"projections": {**ROLES, a: ROLES[b], b: ROLES[a]}}


def _one_line(info: pytest.ExceptionInfo) -> str:
    text = str(info.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_the_right_anatomy_and_discovery_pass():
    check_anatomy(hf_config(LLAMA), {"projections": ROLES})
    check_anatomy(hf_config(LLAMA), None)
    check_anatomy(hf_config({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 512}), None)


@pytest.mark.parametrize(("a", "b", "key", "words"), [
    ("q", "down", "model.anatomy.projections.q", "'mlp.down_proj' (in 128, out 64) does not read the hidden size 64"),
    ("gate", "down", "model.anatomy.projections.gate", "'mlp.down_proj' (in 128, out 64) does not read the hidden size 64"),
    ("k", "q", "model.anatomy.projections.v", "must match k 'self_attn.q_proj' (in 64, out 64): v writes what k writes"),
    ("o", "up", "model.anatomy.projections.o", "'mlp.up_proj' (in 64, out 128) does not write the hidden size 64"),
])
def test_swapped_roles_are_refused_naming_the_key(a, b, key, words):
    with pytest.raises(HFConfigProblem) as info:
        check_anatomy(hf_config(LLAMA), _swapped(a, b))
    message = _one_line(info)
    assert message.startswith(f"{key}: ") and words in message and info.value.key == key


def test_control_without_the_shape_check_a_swapped_anatomy_builds(monkeypatch):
    monkeypatch.setattr(build, "check_roles", lambda *_args, **_kw: None)
    model = build_hf_model(LLAMA, "sdpa", device="meta", anatomy=_swapped("q", "down"))
    assert model.anatomy().block.projections["q"] == "mlp.down_proj"  # every q matmul would be labelled down


@pytest.mark.parametrize(("blocks", "words"), [
    ("model.norm", "names blocks 'model.norm', which is a LlamaRMSNorm, not a non-empty nn.ModuleList or nn.ModuleDict"),
    ("model.nope", "names blocks 'model.nope', but a LlamaForCausalLM has no such submodule"),
])
def test_blocks_that_are_not_a_list_of_modules_are_one_line(blocks, words):
    with pytest.raises(ValueError) as info:
        check_anatomy(hf_config(LLAMA), {"blocks": blocks})
    assert words in _one_line(info)


@pytest.mark.parametrize(("anatomy", "key", "control"), [
    ("{blocks: 5}", "model.anatomy.blocks", "no such submodule"),  # control: looked up as if 5 were a name
    ("{blocks: [model.layers]}", "model.anatomy.blocks", "no such submodule"),
    ("{norms: 5}", "model.anatomy.norms", TypeError),  # control: a traceback from tuple(5)
    ("{projections: [q]}", "model.anatomy.projections", None),
    ("{tied: [[lm_head.weight]]}", "model.anatomy.tied", "accepted"),  # control: taken silently
])
def test_an_anatomy_value_of_the_wrong_form_is_named_when_the_suite_is_read(tmp_path, anatomy, key, control):
    import yaml

    stated = yaml.safe_load(anatomy)
    model = build._on_meta(hf_config(LLAMA), 1)
    if control == "accepted":
        stated_anatomy(model, stated)
    elif control is TypeError:
        with pytest.raises(TypeError):
            stated_anatomy(model, stated)
    elif control is not None:
        with pytest.raises(ValueError, match=control):
            stated_anatomy(model, stated)
    path = tmp_path / "s.yaml"
    path.write_text(f"scenarios:\n  - {{name: a, model: {{hf: {{model_type: llama}}, anatomy: {anatomy}}}}}\n")
    with pytest.raises(ConfigError) as info:
        load_suite(str(path))
    assert f"s.yaml: scenario 'a': {key}: " in _one_line(info)


def test_the_run_preflight_names_file_scenario_and_key(tmp_path):
    path = tmp_path / "s.yaml"
    model = {"hf": {**LLAMA, "num_hidden_layers": 1000}, "anatomy": _swapped("q", "down")}  # JSON is YAML
    path.write_text(f"scenarios:\n  - {{name: a, seq_len: 16, model: {json.dumps(model)}}}\n")
    suite = load_suite(str(path))
    with pytest.raises(ConfigError) as info:
        hf_shape(suite.scenarios[0], suite.origin(suite.scenarios[0]))
    assert "s.yaml: scenario 'a': model.anatomy.projections.q: 'mlp.down_proj' (in 128, out 64)" in _one_line(info)
