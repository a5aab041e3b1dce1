"""``flashckpt export`` loads where users load it: ``load_state_dict(strict=True)`` of the transformers class itself
(a user-built ``GPT2LMHeadModel`` with its tied head, an untied ``LlamaForCausalLM``) and of the project's GPT. A tied
alias is written beside its owner (its own copy in safetensors, which refuses shared storages; the same tensor in a
``.pt``), the tie survives the load, and an untied export is byte for byte what safetensors writes for the weights."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="Hugging Face models need the optional extra pytest-flashckpt[hf]")

from safetensors.torch import load_file, save_file  # noqa: E402

from pytest_flashckpt.checkpoint import Checkpointer  # noqa: E402
from pytest_flashckpt.checkpoint.errors import CheckpointError  # noqa: E402
from pytest_flashckpt.checkpoint.export import export_weights, model_state_dict, with_aliases  # noqa: E402
from pytest_flashckpt.checkpoint.loading import read_checkpoint  # noqa: E402
from pytest_flashckpt.cli import main  # noqa: E402
from pytest_flashckpt.config.scenario import SaveConfig  # noqa: E402
from pytest_flashckpt.training import Trainer  # noqa: E402

TOKENS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


def gpt2(seed: int):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32, **TOKENS)
    return transformers.GPT2LMHeadModel(config)


def llama(seed: int):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                      intermediate_size=48, vocab_size=64, max_position_embeddings=32, **TOKENS)
    return transformers.LlamaForCausalLM(config)


MODELS = {"gpt2-tied": gpt2, "llama-untied": llama}


def saved(make, tmp_path):
    """A user-built model saved by the checkpoint API (weights as built: no step of ours is needed to save)."""
    model = make(seed=1)
    with Checkpointer(tmp_path / "ckpt", SaveConfig(strategy="sync", format="safetensors")) as ckpt:
        ckpt.save(Trainer.create(model, batch_size=1, seq_len=8))
    return model


def same_weights(loaded, expected) -> None:
    want = expected.state_dict()
    assert sorted(loaded.state_dict()) == sorted(want)
    assert [k for k, t in want.items() if not torch.equal(loaded.state_dict()[k], t)] == []


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_transformers_class_loads_the_export_strictly(name: str, suffix: str, tmp_path) -> None:
    make = MODELS[name]
    model = saved(make, tmp_path)
    out = tmp_path / f"weights{suffix}"
    done = export_weights(tmp_path / "ckpt", out)
    sd = load_file(str(out)) if suffix == ".safetensors" else torch.load(out, weights_only=True)
    assert sorted(sd) == sorted(model.state_dict()) == done.keys
    fresh = make(seed=7)
    fresh.load_state_dict(sd, strict=True)
    same_weights(fresh, model)
    if name == "gpt2-tied":
        assert done.tied == {"lm_head.weight": "transformer.wte.weight"}
        assert fresh.lm_head.weight is fresh.transformer.wte.weight  # the tie survives the load


def test_control_without_the_alias_the_strict_load_fails(tmp_path) -> None:
    """What the export wrote before (the tied alias dropped): the transformers class refuses it strictly, so the
    test above can fail."""
    saved(gpt2, tmp_path)
    export_weights(tmp_path / "ckpt", tmp_path / "w.safetensors")
    sd = load_file(str(tmp_path / "w.safetensors"))
    del sd["lm_head.weight"]
    with pytest.raises(RuntimeError, match=r"Missing key\(s\).*lm_head\.weight"):
        gpt2(seed=7).load_state_dict(sd, strict=True)


def test_the_tied_alias_is_its_own_copy_in_safetensors_and_listed_in_the_metadata(tmp_path) -> None:
    from safetensors import safe_open

    saved(gpt2, tmp_path)
    export_weights(tmp_path / "ckpt", tmp_path / "w.safetensors")
    sd = load_file(str(tmp_path / "w.safetensors"))
    assert torch.equal(sd["lm_head.weight"], sd["transformer.wte.weight"])
    assert sd["lm_head.weight"].data_ptr() != sd["transformer.wte.weight"].data_ptr()
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as fh:
        assert json.loads(fh.metadata()["flashckpt.tied"]) == {"lm_head.weight": "transformer.wte.weight"}


def test_an_untied_export_is_byte_exact(tmp_path) -> None:
    """Untied, the export is the file the export wrote before aliases were added (the checkpoint's weights in its
    order, through safetensors): the same header and the same data bytes (safetensors orders its metadata map
    differently from one write to the next, so the header is compared parsed), every tensor the model's bit for bit."""
    model = saved(llama, tmp_path)
    done = export_weights(tmp_path / "ckpt", tmp_path / "w.safetensors")
    assert done.tied == {}
    weights, _ = model_state_dict(read_checkpoint(done.source))
    save_file({k: t.contiguous() for k, t in weights.items()}, str(tmp_path / "before.safetensors"), metadata=done.metadata)
    assert split(tmp_path / "w.safetensors") == split(tmp_path / "before.safetensors")
    sd = load_file(str(tmp_path / "w.safetensors"))
    assert [k for k, t in model.state_dict().items() if not torch.equal(sd[k], t)] == []


def split(path) -> tuple[dict, bytes]:
    """A safetensors file as (its JSON header, its data bytes)."""
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + size]), raw[8 + size:]


def test_a_tie_to_a_missing_owner_is_an_error_not_a_file_that_cannot_load() -> None:
    weights = {"wte.weight": torch.zeros(2, 2)}
    assert sorted(with_aliases(weights, {"lm_head.weight": "wte.weight"}, copy=True)) == ["lm_head.weight", "wte.weight"]
    with pytest.raises(CheckpointError, match="ties 'lm_head.weight' to 'emb.weight', which it does not hold"):
        with_aliases(weights, {"lm_head.weight": "emb.weight"}, copy=True)


def test_the_command_says_the_aliases_are_written(tmp_path, capsys) -> None:
    saved(gpt2, tmp_path)
    assert main(["export", str(tmp_path / "ckpt"), str(tmp_path / "w.safetensors")]) == 0
    assert "tied aliases written beside their owners: lm_head.weight" in capsys.readouterr().out
