"""Shared helpers of the checkpoint proofs: a very small GPT trainer, snapshots, bitwise comparison, and the save
configurations every round-trip proof runs over. (A plain module, not a conftest, so tests can import it.)"""

from __future__ import annotations

import torch

from pytest_flashckpt.checkpoint.state import capture
from pytest_flashckpt.config.scenario import SaveConfig
from pytest_flashckpt.models import GPTConfig, build_model
from pytest_flashckpt.training import Trainer

TINY = GPTConfig(name="proof", n_layer=2, n_embd=32, n_head=2, vocab_size=64, block_size=32)


def make_trainer(init_seed: int = 0, freeze_embeddings: bool = False) -> Trainer:
    """A 2-block GPT (width 32) with AdamW; ``init_seed`` picks the initial weights, data seed is always 0."""
    model = build_model(TINY, "sdpa", seed=init_seed)
    if freeze_embeddings:
        model.wte.weight.requires_grad_(False)
        model.wpe.weight.requires_grad_(False)
    return Trainer.create(model, batch_size=2, seq_len=16, seed=0)


def snapshot(trainer: Trainer) -> dict[str, object]:
    """A deep copy of everything a checkpoint holds: tensors (cloned) and the JSON tree."""
    state = capture(trainer)
    return {"tensors": {k: t.clone() for k, t in state.tensors.items()}, "tree": state.tree}


def assert_same_state(actual: dict, expected: dict, skip_prefix: tuple[str, ...] = ()) -> None:
    """Bitwise equality of two snapshots (keys starting with ``skip_prefix`` ignored)."""
    a = {k: v for k, v in actual["tensors"].items() if not k.startswith(skip_prefix)}
    e = {k: v for k, v in expected["tensors"].items() if not k.startswith(skip_prefix)}
    assert sorted(a) == sorted(e)
    for key in e:
        assert a[key].dtype == e[key].dtype and a[key].shape == e[key].shape, key
        assert torch.equal(a[key], e[key]), key
    tree_a, tree_e = dict(actual["tree"]), dict(expected["tree"])
    if skip_prefix:
        for prefix in skip_prefix:
            tree_a.pop(prefix.rstrip("/"), None)
            tree_e.pop(prefix.rstrip("/"), None)
    assert tree_a == tree_e


CONFIGS: dict[str, SaveConfig] = {
    "sync-torch": SaveConfig(strategy="sync", format="torch"),
    "sync-safetensors": SaveConfig(strategy="sync", format="safetensors"),
    "async-torch": SaveConfig(async_save=True, format="torch"),
    "async-safetensors": SaveConfig(async_save=True, format="safetensors"),
    "dcp": SaveConfig(strategy="dcp"),
    "dcp-async": SaveConfig(strategy="dcp", async_save=True),
    "selective-trainable": SaveConfig(select_params="trainable"),
    "layerwise-safetensors": SaveConfig(layer_checkpoint_dir="layers", format="safetensors"),
    "layerwise-torch": SaveConfig(strategy="layerwise", format="torch"),
    "scheduled": SaveConfig(mem_threshold=1.0, save_interval=1),
    # axes no preset names (a derived strategy name)
    "selective-background": SaveConfig(layout="selected", staging="background", select_params="trainable"),
    "layerwise-overlapped": SaveConfig(layout="layerwise", staging="overlapped"),
}
