"""Round trips are exact for every strategy: train N == train k, save, restore into fresh objects, train N - k."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from ckpt_helpers import CONFIGS, assert_same_state, make_trainer, snapshot
from pytest_flashckpt.checkpoint import Checkpointer, load_into, resume_latest


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_resume_equals_uninterrupted(name: str, tmp_path) -> None:
    check_resume(name, k=2, rest=2, root=tmp_path)


@pytest.mark.slow
@given(name=st.sampled_from(sorted(CONFIGS)), k=st.integers(1, 4), rest=st.integers(0, 3))
def test_resume_equals_uninterrupted_any_split(name: str, k: int, rest: int, tmp_path_factory) -> None:
    check_resume(name, k, rest, tmp_path_factory.mktemp(name))


def check_resume(name: str, k: int, rest: int, root) -> None:
    frozen = name.startswith("selective")  # "trainable" selection: the frozen embeddings come from the base
    straight = make_trainer(freeze_embeddings=frozen)
    for _ in range(k + rest):
        straight.train_step()

    first = make_trainer(freeze_embeddings=frozen)
    with Checkpointer(root, CONFIGS[name]) as ckpt:
        first.train_step()
        ckpt.save(first)  # a selective run's first save is its full base
        for _ in range(k - 1):
            first.train_step()
        ckpt.save(first)
    resumed = make_trainer(init_seed=1, freeze_embeddings=frozen)  # different weights: the restore must overwrite them
    loaded = resume_latest(resumed, root)
    assert loaded is not None and loaded.manifest.step == k
    for _ in range(rest):
        resumed.train_step()
    assert_same_state(snapshot(resumed), snapshot(straight), skip_prefix=("rng/",))


@pytest.mark.parametrize("name", ["sync-torch", "sync-safetensors", "dcp"])
def test_every_rng_stream_is_restored(name: str, tmp_path) -> None:
    trainer = make_trainer()
    trainer.train_step()
    torch.manual_seed(123), random.seed(5), np.random.seed(7)
    with Checkpointer(tmp_path, CONFIGS[name]) as ckpt:
        record = ckpt.save(trainer)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    load_into(make_trainer(init_seed=2), tmp_path / record.name)
    assert torch.equal(torch.rand(3), expected[0])
    assert random.random() == expected[1]
    assert np.random.rand() == expected[2]


def test_tied_head_is_saved_once_and_stays_tied(tmp_path) -> None:
    trainer = make_trainer()
    trainer.train_step()
    with Checkpointer(tmp_path, CONFIGS["sync-safetensors"]) as ckpt:
        record = ckpt.save(trainer)
    from safetensors.torch import load_file

    names = set(load_file(str(tmp_path / record.name / "state.safetensors")))
    assert "model/wte.weight" in names and "model/lm_head.weight" not in names
    fresh = make_trainer(init_seed=3)
    load_into(fresh, tmp_path / record.name)
    assert fresh.model.lm_head.weight is fresh.model.wte.weight
    assert torch.equal(fresh.model.lm_head.weight, trainer.model.wte.weight)
