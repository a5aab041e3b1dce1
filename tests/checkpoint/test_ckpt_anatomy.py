"""Selective and layer-wise saves and export read the model's anatomy on the project's own families too: GPT
(tied head, ``blocks``) and Llama-style (untied head, ``embed_tokens``): the untied head is selected and resumes
bitwise, one file per block, export writes the head for a strict load."""

from __future__ import annotations

import pytest
import torch

from pytest_flashckpt.checkpoint import Checkpointer, resume_latest
from pytest_flashckpt.checkpoint.export import export_weights
from pytest_flashckpt.checkpoint.selection import select_names
from pytest_flashckpt.checkpoint.state import capture
from pytest_flashckpt.config.scenario import SaveConfig
from pytest_flashckpt.models import build_model, load_card
from pytest_flashckpt.training import Trainer

CARDS = {
    "gpt": ("tiny", {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64, "block_size": 32}),
    "llama": ("llama-tiny", {"n_layer": 2, "n_embd": 48, "n_head": 6, "n_kv_head": 2, "intermediate_size": 72,
                             "vocab_size": 64, "block_size": 32}),
}
EMBEDDINGS = {"gpt": {"wte.weight", "wpe.weight", "lm_head.weight"}, "llama": {"embed_tokens.weight"}}


def make(family: str, seed: int = 0, frozen: bool = False) -> Trainer:
    card, overrides = CARDS[family]
    model = build_model(load_card(card, **overrides), "sdpa", seed=seed)
    if frozen:
        for name, p in model.named_parameters():
            if name in EMBEDDINGS[family]:
                p.requires_grad_(False)
    return Trainer.create(model, batch_size=2, seq_len=16, seed=0)


@pytest.mark.parametrize("family", sorted(CARDS))
def test_selective_true_leaves_out_embeddings_and_only_a_tied_head(family: str) -> None:
    model = make(family).model
    names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    assert names - select_names(model, True) == EMBEDDINGS[family]


@pytest.mark.parametrize("family", sorted(CARDS))
def test_selective_true_resumes_bitwise_with_frozen_embeddings(family: str, tmp_path) -> None:
    straight = make(family, frozen=True)
    for _ in range(3):
        straight.train_step()
    first = make(family, frozen=True)
    with Checkpointer(tmp_path, SaveConfig(select_params=True)) as ckpt:
        first.train_step()
        ckpt.save(first)
        first.train_step()
        ckpt.save(first)
    resumed = make(family, seed=1, frozen=True)
    resume_latest(resumed, tmp_path)
    resumed.train_step()
    a, b = capture(resumed).tensors, capture(straight).tensors
    assert [k for k in b if not k.startswith("rng/") and not torch.equal(a[k], b[k])] == []


@pytest.mark.parametrize("family", sorted(CARDS))
def test_layerwise_and_export_follow_the_anatomy(family: str, tmp_path) -> None:
    from safetensors.torch import load_file

    trainer = make(family)
    trainer.train_step()
    with Checkpointer(tmp_path / "ckpt", SaveConfig(strategy="layerwise", format="safetensors")) as ckpt:
        record = ckpt.save(trainer)
    files = sorted(p.name for p in (tmp_path / "ckpt" / record.name / "layers").iterdir())
    assert files == ["block_000.safetensors", "block_001.safetensors", "rest.safetensors"]
    export_weights(tmp_path / "ckpt", tmp_path / "model.safetensors")
    weights = load_file(str(tmp_path / "model.safetensors"))
    assert "lm_head.weight" in weights  # tied (GPT) or not (Llama): a strict load needs every key
    fresh = make(family, seed=4).model
    fresh.load_state_dict(weights, strict=True)
    assert all(torch.equal(fresh.state_dict()[k], t) for k, t in trainer.model.state_dict().items())
