"""Saves and export by anatomy on Hugging Face models (built from configs, random init): every save strategy
resumes bitwise on GPT-2 (tied head, Conv1D) and Llama (untied head); selective and layer-wise saves key on the
anatomy (blocks path, embeddings, head, tie), not on the project's parameter names; export writes a tied head
beside its embedding (tests/checkpoint/test_ckpt_export_strict.py: strict loads into user-built models)."""

from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("transformers", reason="Hugging Face models need the optional extra pytest-flashckpt[hf]")

from ckpt_helpers import CONFIGS  # noqa: E402
from pytest_flashckpt.checkpoint import Checkpointer, load_blocks, resume_latest  # noqa: E402
from pytest_flashckpt.checkpoint.export import export_weights  # noqa: E402
from pytest_flashckpt.checkpoint.selection import select_names  # noqa: E402
from pytest_flashckpt.checkpoint.state import capture  # noqa: E402
from pytest_flashckpt.config.scenario import SaveConfig  # noqa: E402
from pytest_flashckpt.models.hf import build_hf_model  # noqa: E402
from pytest_flashckpt.training import Trainer  # noqa: E402

HF = {
    "gpt2": {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 32},
    "llama": {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 48, "vocab_size": 64, "max_position_embeddings": 32},
}
EMBEDDINGS = {"gpt2": ("transformer.wte.weight", "transformer.wpe.weight"), "llama": ("model.embed_tokens.weight",)}
SAVES = {**CONFIGS, "selective-true": SaveConfig(select_params=True)}


def make(family: str, seed: int = 0, frozen: bool = False) -> Trainer:
    model = build_hf_model(HF[family], "sdpa", seed=seed)  # dropout 0.1 on GPT-2 (its default): RNG restored too
    if frozen:
        for name, p in model.named_parameters():
            if name in EMBEDDINGS[family]:
                p.requires_grad_(False)
    return Trainer.create(model, batch_size=2, seq_len=16, seed=0)


@functools.cache
def uninterrupted(family: str, frozen: bool) -> Trainer:
    """Four steps without a save: the run every strategy's resume must equal. It depends on the family and the frozen
    embeddings only (the model's init forks the RNG; the steps start from the global seed 0), so it is trained once
    per (family, frozen) for the 24 cases, not once per case; it is only read afterwards."""
    straight = make(family, frozen=frozen)
    torch.manual_seed(0)  # GPT-2's dropout draws from the global RNG: both runs start from one state
    for _ in range(4):
        straight.train_step()
    return straight


def same(a: Trainer, b: Trainer) -> None:
    sa, sb = capture(a), capture(b)
    assert sorted(sa.tensors) == sorted(sb.tensors)
    for key, t in sa.tensors.items():
        if not key.startswith("rng/"):
            assert torch.equal(t, sb.tensors[key]), key


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SAVES))
@pytest.mark.parametrize("family", sorted(HF))
def test_every_save_strategy_resumes_bitwise(family: str, name: str, tmp_path) -> None:
    frozen = name.startswith("selective")  # left to the base: exact only when frozen (the embeddings here)
    straight = uninterrupted(family, frozen)
    first = make(family, frozen=frozen)
    torch.manual_seed(0)
    with Checkpointer(tmp_path, SAVES[name]) as ckpt:
        first.train_step()
        ckpt.save(first)  # a selective run's first save is its full base
        first.train_step()
        ckpt.save(first)
    resumed = make(family, seed=1, frozen=frozen)
    torch.manual_seed(1)  # the resume restores the RNG streams
    loaded = resume_latest(resumed, tmp_path)
    assert loaded is not None and loaded.manifest.step == 2
    resumed.train_step()
    resumed.train_step()
    same(resumed, straight)


@pytest.mark.parametrize("family", sorted(HF))
def test_selective_true_leaves_out_the_embeddings_only(family: str) -> None:
    model = make(family).model
    chosen = select_names(model, True)
    names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    left_out = names - chosen
    if family == "gpt2":  # the tied head is the embedding: left out with it
        assert left_out == {*EMBEDDINGS["gpt2"], "lm_head.weight"}
    else:  # untied: the head is trained and selected (it came back from the base, not bitwise, before)
        assert left_out == set(EMBEDDINGS["llama"]) and "lm_head.weight" in chosen


@pytest.mark.parametrize("family", sorted(HF))
def test_layerwise_writes_one_file_per_decoder_layer(family: str, tmp_path) -> None:
    trainer = make(family)
    trainer.train_step()
    with Checkpointer(tmp_path, SaveConfig(strategy="layerwise", format="safetensors")) as ckpt:
        record = ckpt.save(trainer)
    files = sorted(p.name for p in (tmp_path / record.name / "layers").iterdir())
    assert files == ["block_000.safetensors", "block_001.safetensors", "rest.safetensors"]
    fresh = make(family, seed=5)
    report = load_blocks(fresh.model, tmp_path / record.name, [1])
    prefix = "transformer.h.1." if family == "gpt2" else "model.layers.1."
    assert report.loaded and all(k.startswith(prefix) for k in report.loaded)
    for k in report.loaded:
        assert torch.equal(fresh.model.state_dict()[k], trainer.model.state_dict()[k]), k


@pytest.mark.parametrize("family", sorted(HF))
def test_export_loads_strictly_tied_or_not(family: str, tmp_path) -> None:
    from safetensors.torch import load_file

    trainer = make(family)
    trainer.train_step()
    with Checkpointer(tmp_path / "ckpt", SaveConfig(strategy="sync")) as ckpt:
        ckpt.save(trainer)
    exported = export_weights(tmp_path / "ckpt", tmp_path / "model.safetensors")
    weights = load_file(str(tmp_path / "model.safetensors"))
    fresh = build_hf_model(HF[family], "sdpa", seed=9)
    if family == "gpt2":
        assert exported.tied == {"lm_head.weight": "transformer.wte.weight"} and "lm_head.weight" in weights
        fresh.load_state_dict(weights, strict=True)
        assert fresh.lm_head.weight is fresh.transformer.wte.weight  # the tie survives the load
    else:
        assert exported.tied == {} and "lm_head.weight" in weights
        fresh.load_state_dict(weights, strict=True)
    for key, t in trainer.model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], t), key
