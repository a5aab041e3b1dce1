"""Selective saves on top of a base, and layer-wise files loaded block by block."""

from __future__ import annotations

import pytest
import torch

from ckpt_helpers import make_trainer
from pytest_flashckpt.checkpoint import Checkpointer, StrictLoadError, load_blocks, load_into, load_model_tensors, read_checkpoint
from pytest_flashckpt.checkpoint.rotation import to_delete
from pytest_flashckpt.config.scenario import SaveConfig
from pytest_flashckpt.models import GPTConfig, build_model


def test_selective_restores_selected_on_top_of_its_base(tmp_path) -> None:
    trainer = make_trainer()
    with Checkpointer(tmp_path, SaveConfig(select_params=True, max_keep=1)) as ckpt:
        trainer.train_step()
        base = ckpt.save(trainer)
        base_wte = trainer.model.wte.weight.detach().clone()
        trainer.train_step()
        trainer.train_step()
        sel = ckpt.save(trainer)
    live = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    loaded = read_checkpoint(tmp_path / sel.name)
    assert loaded.manifest.base == base.name
    assert {k for k in loaded.tensors if k.startswith("model/")} - loaded.from_base == {f"model/{n}" for n in live if not n.startswith(("wte", "wpe"))}
    assert (tmp_path / base.name).is_dir(), "max_keep rotation must keep the base of a kept selective checkpoint"
    fresh = make_trainer(init_seed=6)
    load_into(fresh, tmp_path / sel.name)
    for name, p in fresh.model.named_parameters():
        expected = base_wte if name == "wte.weight" else live[name]
        if name != "wpe.weight":
            assert torch.equal(p, expected), name
    assert fresh.step == 3
    assert sel.bytes_written < base.bytes_written


def test_selective_reports_missing_and_unexpected_keys(tmp_path) -> None:
    trainer = make_trainer()
    with Checkpointer(tmp_path, SaveConfig(select_params=["blocks.*"])) as ckpt:
        ckpt.save(trainer)
        sel = ckpt.save(trainer)
    model = make_trainer(init_seed=7).model
    report = load_model_tensors(model, tmp_path / sel.name, strict=False, with_base=False)
    assert report.unexpected_keys == [] and report.missing_keys == []
    assert all(k.startswith("blocks.") for k in report.loaded)
    deeper = build_model(GPTConfig(n_layer=3, n_embd=32, n_head=2, vocab_size=64, block_size=32), "sdpa")
    with pytest.raises(StrictLoadError, match="missing keys .*blocks.2"):
        load_model_tensors(deeper, tmp_path / sel.name)
    shallower = build_model(GPTConfig(n_layer=1, n_embd=32, n_head=2, vocab_size=64, block_size=32), "sdpa")
    with pytest.raises(StrictLoadError, match="unexpected keys .*blocks.1"):
        load_model_tensors(shallower, tmp_path / sel.name)
    report = load_model_tensors(shallower, tmp_path / sel.name, strict=False)
    assert "blocks.1.attn.c_attn.weight" in report.unexpected_keys


def test_selection_that_matches_nothing_is_an_error(tmp_path) -> None:
    with Checkpointer(tmp_path, SaveConfig(select_params=["nope.*"])) as ckpt:
        trainer = make_trainer()
        ckpt.save(trainer)
        with pytest.raises(ValueError, match="selects no parameter"):
            ckpt.save(trainer)


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
@pytest.mark.parametrize("blocks", [[0], [1], [0, 1]])
def test_layerwise_partial_load_equals_the_same_blocks_of_a_full_load(fmt: str, blocks: list[int], tmp_path) -> None:
    trainer = make_trainer()
    trainer.train_step()
    with Checkpointer(tmp_path, SaveConfig(layer_checkpoint_dir="per-layer", format=fmt)) as ckpt:
        record = ckpt.save(trainer)
    folder = tmp_path / record.name
    files = sorted(p.name for p in (folder / "per-layer").iterdir())
    suffix = ".pt" if fmt == "torch" else ".safetensors"
    assert files == [f"block_000{suffix}", f"block_001{suffix}", f"rest{suffix}"]
    full = make_trainer(init_seed=8)
    load_into(full, folder)
    partial = make_trainer(init_seed=8).model
    untouched = {n: p.detach().clone() for n, p in partial.named_parameters()}
    report = load_blocks(partial, folder, blocks)
    assert report.loaded and all(any(k.startswith(f"blocks.{b}.") for b in blocks) for k in report.loaded)
    full_params = dict(full.model.named_parameters())
    for name, p in partial.named_parameters():
        in_loaded = any(name.startswith(f"blocks.{b}.") for b in blocks)
        assert torch.equal(p, full_params[name] if in_loaded else untouched[name]), name


def test_rotation_plan_never_drops_newest(tmp_path) -> None:
    trainer = make_trainer()
    with Checkpointer(tmp_path, SaveConfig(strategy="sync", max_keep=2)) as ckpt:
        for _ in range(4):
            trainer.train_step()
            ckpt.save(trainer)
        assert [p.name for p in ckpt.store.complete()] == [r.name for r in ckpt.records[-2:]]
        assert to_delete(ckpt.store, 1) == [ckpt.store.complete()[0]]
