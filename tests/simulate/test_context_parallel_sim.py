"""A context-parallel rank simulated (modelled) on meta: torch's ring attention with the CUDA flash op inside the
meta step at seq / cp tokens, and the requests it refuses before anything runs."""

from __future__ import annotations

import pytest
import torch

from pytest_flashckpt.config.layout import Layout
from pytest_flashckpt.models import attention
from pytest_flashckpt.models.cards import load_card
from pytest_flashckpt.distributed.context_parallel import ring
from pytest_flashckpt.simulate import context_parallel as cp_sim

CARD = {"n_layer": 1, "n_embd": 64, "n_head": 4, "n_kv_head": 2, "intermediate_size": 88, "vocab_size": 256, "block_size": 256}


def test_a_cp_rank_runs_torchs_ring_attention_on_its_share_of_the_sequence(monkeypatch) -> None:
    calls = {"forward": 0, "backward": 0}
    forward, backward = ring._templated_ring_attention, ring._templated_ring_attention_backward

    def counted(name, fn):
        def run(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return run

    monkeypatch.setattr(ring, "_templated_ring_attention", counted("forward", forward))
    monkeypatch.setattr(ring, "_templated_ring_attention_backward", counted("backward", backward))
    card = load_card("llama-tiny", **CARD)
    two, four = (cp_sim.simulate_cp_rank(card, Layout(cp=n), batch_size=1, seq_len=256) for n in (2, 4))
    assert calls == {"forward": 4, "backward": 4}  # 2 steps (warm, measured) x 1 block, per cp size
    assert two["label"] == "modelled" and two["seq_per_rank"] == 128 and four["seq_per_rank"] == 64
    assert two["start_bytes"] == four["start_bytes"]  # cp replicates the state; only activations shrink
    assert four["peak_bytes"] < two["peak_bytes"]
    # at cp 2 the step's peak is outside attention and the ring's exchange buffers are gone; what stays is one copy
    # per block: the ring's merged output is (B, H, T, D)-contiguous where the flash op's is (B, T, H, D), so the
    # reshape before o_proj copies it (bf16, batch 1 x 128 local tokens x width 64). At cp 4 the peak falls in
    # the ring's backward, where its K/V (and float32 K/V gradient) exchange buffers add to that copy.
    copy = {n: 1 * 256 // n * 64 * 2 for n in (2, 4)}
    assert two["ring_extra_bytes"] == copy[2]
    assert four["ring_extra_bytes"] > copy[4]
    assert attention._explicit_op.__name__ == "_explicit_op" and not torch.distributed.is_initialized()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(layout=Layout(cp=4), seq_len=100), r"layout cp 4: sequence 100 is not divisible by 2 x cp = 8"),
        (dict(layout=Layout(cp=3), seq_len=100, load_balanced=False), r"sequence 100 is not divisible by cp 3"),
        (dict(layout=Layout(cp=1)), r"cp 1: context parallel needs cp >= 2"),
        (dict(layout=Layout(dp_shard=2, cp=2)), r"the CUDA-op ring on meta simulates cp alone \(dp_shard 2\); a cp rank composed with dp_shard or tp is "
                                                r"simulate.fake_ranks'"),
        (dict(layout=Layout(cp=2), kernel="efficient"), r"CUDA flash op .* got kernel efficient.*--kernel flash"),
        (dict(layout=Layout(cp=2), dtype="float32"), r"got kernel flash in float32"),
        (dict(layout=Layout(cp=2), rotation="ring"), r"rotation 'ring' is unknown; use one of allgather, alltoall"),
        (dict(layout=Layout(cp=2), seq_len=512), r"sequence 512 exceeds block_size 256"),
    ],
)
def test_impossible_requests_are_refused_before_anything_runs(kwargs, match) -> None:
    request = {"batch_size": 1, "seq_len": 64, **kwargs}
    with pytest.raises(ValueError, match=match):
        cp_sim.simulate_cp_rank(load_card("llama-tiny", **CARD), request.pop("layout"), **request)
    assert not torch.distributed.is_initialized()
