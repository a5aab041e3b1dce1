"""Enumeration and the exact prune, and the requests that cannot be split."""

from __future__ import annotations

import pytest

from pytest_flashckpt.config.errors import InputError
from pytest_flashckpt.config.model_card import load_card
from pytest_flashckpt.fit.candidates import STATE_BYTES_PER_PARAM, enumerate_candidates, state_lower_bound, tp_degrees

CARD = load_card("llama-tiny")  # 6 query heads over 2 key/value heads: tp 1 or 2


def test_every_candidate_trains_the_global_batch_and_tp_divides_the_heads() -> None:
    found = enumerate_candidates(CARD, 8, seq_len=64, global_batch_tokens=64 * 16, gpus_per_node=8,
                                 precisions=("pure", "mixed"))
    assert {c.tp for c in found} == {1, 2}
    for c in found:
        assert c.dp * c.tp == 8
        assert c.dp * c.microbatch * c.accumulation * 64 == 64 * 16
        assert c.reshard_after_forward or c.dp_shard > 1
        assert c.dp_replicate == 1 or (c.dp_shard * c.tp) % 8 == 0
    assert len(found) == len(set(found))
    assert {c.strategy for c in found} == {"none", "selective_op", "every_k", "full"}


def test_tp_is_refused_when_it_does_not_divide_the_heads_or_leaves_the_node() -> None:
    with pytest.raises(InputError, match=r"--tp 4: model card 'llama-tiny' has n_head 6, not divisible by 4"):
        tp_degrees(CARD, 8, 8, (4,))
    with pytest.raises(InputError, match="--tp 2: more than the 1 GPUs of a node"):
        tp_degrees(CARD, 8, 1, (2,))
    assert tp_degrees(CARD, 8, 8) == [1, 2]


def test_a_batch_that_cannot_be_split_is_refused_naming_the_fix() -> None:
    with pytest.raises(InputError, match="not a multiple of --seq 64"):
        enumerate_candidates(CARD, 4, seq_len=64, global_batch_tokens=100, gpus_per_node=8)
    with pytest.raises(InputError, match=r"--gpus 8: the global batch of 3 sequences .* cannot be split"):
        enumerate_candidates(CARD, 8, seq_len=64, global_batch_tokens=64 * 3, gpus_per_node=8)
    with pytest.raises(InputError, match="no tensor-parallel degree divides both 5 GPUs"):
        enumerate_candidates(CARD, 5, seq_len=64, global_batch_tokens=64 * 5, gpus_per_node=8, tp=(2,))

def test_the_state_bound_is_the_even_split_of_the_training_state() -> None:
    c = enumerate_candidates(CARD, 4, seq_len=64, global_batch_tokens=64 * 4, gpus_per_node=8)[0]
    assert state_lower_bound(1000, c) == -(-1000 // (c.dp_shard * c.tp)) * STATE_BYTES_PER_PARAM["mixed"]
