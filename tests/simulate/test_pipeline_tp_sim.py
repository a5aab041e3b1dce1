"""Tensor parallel inside pipeline stages, simulated in this process (``simulate.pipeline`` under FakeTensorMode with
torch's fake process group): the stage build of ``distributed.pipeline`` at pp 2 x tp 2 and dp_shard 2 x pp 2 x tp 2,
and its refusals. Those layouts on gloo, loss, gradients and bytes, are tests/distributed/test_pipeline_tp.py (slow)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

from pytest_flashckpt.config.layout import Layout, PipelineSchedule
from pytest_flashckpt.distributed import pipeline as pp
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.simulate.pipeline import simulate_pipeline_rank

# whole heads at tp 2 (4 query, 2 key/value), a vocabulary and a sequence tp 2 divides
CARD = {"n_layer": 2, "n_embd": 32, "n_head": 4, "n_kv_head": 2, "intermediate_size": 40, "vocab_size": 128, "block_size": 32}
BATCH, SEQ, MICROBATCHES = 4, 8, 4


def _rank(rank: int, layout: Layout, schedule: str = "1f1b", **card) -> dict:
    return simulate_pipeline_rank(load_card("llama-tiny", **{**CARD, **card}), layout, PipelineSchedule(schedule, MICROBATCHES),
                                  batch_size=BATCH, seq_len=SEQ, rank=rank, extrapolate=False)


def test_each_stage_holds_its_share_of_the_root_plan() -> None:
    model = build_model(load_card("llama-tiny", **CARD), "sdpa", "meta", torch.float32)
    first, last = pp.split_stage(model, 0, 2), pp.split_stage(model, 1, 2)
    assert {k: type(v) for k, v in pp.stage_plan(first).items()} == {"embed_tokens": RowwiseParallel}
    assert {k: type(v) for k, v in pp.stage_plan(last).items()} == {"norm": SequenceParallel, "lm_head": ColwiseParallel}
    assert pp.stage_plan(pp.split_stage(build_model(load_card("llama-tiny", **{**CARD, "n_layer": 3}), "sdpa", "meta"), 1, 3)) == {}


@pytest.mark.slow
def test_simulated_pp2_x_tp2_ranks_hold_tensor_parallel_shards_of_their_stage() -> None:
    """Ranks 0 and 1 are stage 0's two tp ranks, 2 and 3 stage 1's (mesh (pp, dp_shard, tp)); one process simulates
    them one after the other (each its own fake group). The tp ranks of a stage hold the same bytes, fewer than
    the stage holds at tp 1, and stage 0's receive buffers are each microbatch's output gradient at T / tp."""
    layout = Layout(tp=2, pp=2)
    ranks = {r: _rank(r, layout) for r in range(4)}
    assert [ranks[r]["stages"] for r in range(4)] == [[0], [0], [1], [1]]
    keys = ("fwd_bwd_start_bytes", "fwd_bwd_peak_bytes", "optimizer_start_bytes", "optimizer_peak_bytes", "buffer_bytes")
    for a, b in ((0, 1), (2, 3)):
        assert {k: ranks[a][k] for k in keys} == {k: ranks[b][k] for k in keys}
    # one (1 row, T / tp, width) float32 gradient buffer per microbatch on the first stage
    assert ranks[0]["buffer_bytes"] == MICROBATCHES * 1 * (SEQ // 2) * CARD["n_embd"] * 4
    alone = {r: _rank(r, Layout(pp=2)) for r in (0, 1)}
    for tp_rank, pp_rank in ((0, 0), (2, 1)):
        assert ranks[tp_rank]["fwd_bwd_start_bytes"] < alone[pp_rank]["fwd_bwd_start_bytes"]
        assert ranks[tp_rank]["peak_bytes"] < alone[pp_rank]["peak_bytes"]
    assert not torch.distributed.is_initialized()


def test_impossible_tensor_parallel_stages_are_refused_before_anything_runs() -> None:
    with pytest.raises(ValueError, match=r"layout tp 4: model card 'llama-tiny' has n_kv_head 2, not divisible by tp"):
        _rank(0, Layout(tp=4, pp=2))
    with pytest.raises(ValueError, match=r"inside pipeline stages: vocabulary 127 is not divisible by tp"):
        _rank(0, Layout(tp=2, pp=2), vocab_size=127)
    with pytest.raises(ValueError, match=r"4 pipeline stages .* for 2 blocks"):
        _rank(0, Layout(tp=2, pp=4))
    with pytest.raises(ValueError, match=r"inside pipeline stages: sequence 7 is not divisible by tp"):
        simulate_pipeline_rank(load_card("llama-tiny", **CARD), Layout(tp=2, pp=2), PipelineSchedule("1f1b", 4),
                               batch_size=4, seq_len=7)
    assert not torch.distributed.is_initialized()


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, pytest.param(3, marks=pytest.mark.slow)])
def test_a_deep_tensor_parallel_stage_read_off_the_line_equals_the_whole_stage(rank: int) -> None:
    """The depth extrapolation of ``simulate_pipeline_rank`` at pp 2 x tp 2: a few blocks per stage read to the
    card's 16 blocks (8 per stage) give the whole stage's bytes (the first pipeline rank; the last under ``-m
    slow``). Measured on the first rank: the line through 1, 2 and 3 blocks per stage bends at tp 2, so the samples slide one deeper
    (2, 4, 6, 8 blocks), as the extrapolation does for any bent line."""
    card = load_card("llama-tiny", **{**CARD, "n_layer": 16})
    layout, schedule = Layout(tp=2, pp=2), PipelineSchedule("1f1b", MICROBATCHES)
    line = simulate_pipeline_rank(card, layout, schedule, batch_size=BATCH, seq_len=SEQ, rank=rank)
    whole = simulate_pipeline_rank(card, layout, schedule, batch_size=BATCH, seq_len=SEQ, rank=rank, extrapolate=False)
    assert line["extrapolated"] and max(line["simulated_depths"]) < 16, line["simulated_depths"]
    keys = ("peak_bytes", "fwd_bwd_start_bytes", "fwd_bwd_peak_bytes", "optimizer_start_bytes", "optimizer_peak_bytes",
            "buffer_bytes")
    assert {k: line[k] for k in keys} == {k: whole[k] for k in keys}


@pytest.mark.slow
def test_fsdp_and_tensor_parallel_inside_the_stages_of_a_3d_layout_are_simulated() -> None:
    """dp_shard 2 x pp 2 x tp 2 (8 ranks) in mixed precision: FSDP2 on the dp_shard dimension over the tensor-parallel
    DTensors of each stage (the mesh's ranks: 0 on stage 0, 7 on stage 1); its state is under the tp-alone stage's
    (control: dp_shard 1). The layout runs on 8 gloo ranks too, in float32 on the worker's 4-block card
    (tests/distributed/test_pipeline_tp.py[dp2xpp2xtp2], slow): one process's loss (2.4e-7) and gradients (4.1e-8)
    under GPipe, 1F1B and interleaved 1F1B, and every rank simulated beside its gloo rank, equal to the byte at every
    window's start, the optimizer peak, the buffers and the largest all-gather. Mixed precision, as here, is
    simulated only."""
    card = load_card("llama-tiny", **CARD)

    def rank(r: int, dp: int) -> dict:
        return simulate_pipeline_rank(card, Layout(dp_shard=dp, tp=2, pp=2), PipelineSchedule("1f1b", 2), batch_size=4,
                                      seq_len=SEQ, rank=r, dtype=torch.bfloat16, precision="mixed", extrapolate=False)

    three_d = {r: rank(r, 2) for r in (0, 7)}
    assert [three_d[r]["stages"] for r in (0, 7)] == [[0], [1]]
    for r, alone in ((0, 0), (7, 3)):
        assert three_d[r]["fwd_bwd_start_bytes"] < rank(alone, 1)["fwd_bwd_start_bytes"]
