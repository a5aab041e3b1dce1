"""Pipeline stages without a process group: the split read from the anatomy (on meta), its refusals, and one
rank simulated under fake mode by torch's own schedules (``simulate.pipeline``) on a tiny card. The gloo ranks
these are checked against are tests/distributed/test_pipeline.py (slow)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from pytest_flashckpt.config.layout import Layout, PipelineSchedule
from pytest_flashckpt.distributed import pipeline as pp
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.simulate.pipeline import simulate_pipeline_rank

TINY = {"n_layer": 4, "n_embd": 32, "n_head": 2, "n_kv_head": 1, "intermediate_size": 40, "vocab_size": 128, "block_size": 32}


def _meta(card: str = "llama-tiny", **overrides) -> nn.Module:
    return build_model(load_card(card, **overrides), "sdpa", "meta", torch.float32)


def test_stage_ranges_are_consecutive_and_cover_every_block() -> None:
    assert pp.stage_ranges(5, 2) == [range(0, 3), range(3, 5)]
    assert pp.stage_ranges(4, 4) == [range(i, i + 1) for i in range(4)]
    assert pp.stages_of_rank(1, 2, 2) == [1, 3]  # torch's loop order for the interleaved schedule
    with pytest.raises(ValueError, match=r"5 stages for 4 blocks"):
        pp.stage_ranges(4, 5)


def test_split_keeps_the_embedding_first_and_the_head_last_and_names_the_whole_model() -> None:
    model = _meta(**TINY)
    whole = {name for name, _ in model.named_parameters()}
    stages = [pp.split_stage(model, i, 3) for i in range(3)]
    assert [len(s.part.blocks) for s in stages] == [2, 1, 1]
    assert isinstance(stages[0].part.lm_head, nn.Identity) and isinstance(stages[1].part.norm, nn.Identity)
    assert isinstance(stages[2].part.embed_tokens, pp._Received) and hasattr(stages[2].part.lm_head, "weight")
    mapped = [full for s in stages for full in s.names.values()]
    assert sorted(mapped) == sorted(whole)  # every parameter on exactly one stage, named as in the whole model
    assert stages[1].names["part.blocks.0.mlp.up_proj.weight"] == "blocks.2.mlp.up_proj.weight"
    assert len(model.blocks) == 4 and hasattr(model.lm_head, "weight")  # the model itself left whole


def test_a_stage_runs_the_family_forward_on_what_it_receives() -> None:
    model = build_model(load_card("llama-tiny", **TINY), "sdpa", "cpu", torch.float32, seed=0)
    tokens = torch.randint(0, 128, (2, 8))
    first, last = pp.split_stage(model, 0, 2), pp.split_stage(model, 1, 2)
    torch.testing.assert_close(last(first(tokens)), model(tokens), rtol=0, atol=0)


def test_tied_heads_and_learned_positions_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match=r"ties lm_head.weight to wte.weight.*untied card.*or pp 1"):
        pp.split_stage(_meta("tiny", n_layer=2), 0, 2)
    with pytest.raises(ValueError, match=r"ties lm_head.weight to embed_tokens.weight"):
        pp.split_stage(_meta("llama-tiny", tie_word_embeddings=True), 0, 2)
    pp.split_stage(_meta("tiny", n_layer=2), 0, 1)  # one stage: nothing to split, the tie holds


@pytest.mark.slow
def test_simulated_first_stage_holds_the_schedules_in_flight_microbatches() -> None:
    """GPipe keeps all 4 microbatches' activations on stage 0 before the first backward, 1F1B pp = 2 of them: the
    simulated stage-0 peak is lower under 1F1B by about two microbatches; the state is the same."""
    card, layout = load_card("llama-tiny", **{**TINY, "n_layer": 2}), Layout(pp=2)
    run = {s: simulate_pipeline_rank(card, layout, PipelineSchedule(s, 4), batch_size=4, seq_len=8, rank=0)
           for s in ("gpipe", "1f1b")}
    assert run["gpipe"]["fwd_bwd_start_bytes"] == run["1f1b"]["fwd_bwd_start_bytes"]
    added = {s: r["fwd_bwd_peak_bytes"] - r["fwd_bwd_start_bytes"] for s, r in run.items()}
    assert added["1f1b"] < added["gpipe"]
    # the first stage receives no activations, only each microbatch's output gradient (1 row x 8 x 32 float32)
    assert run["1f1b"]["stages"] == [0] and run["1f1b"]["buffer_bytes"] == 4 * 1 * 8 * 32 * 4
    assert not torch.distributed.is_initialized()  # the fake group is gone: the next call can start its own


def test_simulated_rank_refuses_impossible_requests_before_anything_runs() -> None:
    card = load_card("llama-tiny", **TINY)
    with pytest.raises(ValueError, match=r"8 pipeline stages .* for 4 blocks"):
        simulate_pipeline_rank(card, Layout(pp=8), PipelineSchedule("gpipe", 1), batch_size=4, seq_len=16)
    with pytest.raises(ValueError, match=r"3 microbatches do not divide"):
        simulate_pipeline_rank(card, Layout(pp=2), PipelineSchedule("1f1b", 3), batch_size=4, seq_len=16)
    assert not torch.distributed.is_initialized()
