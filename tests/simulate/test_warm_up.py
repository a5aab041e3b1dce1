"""A simulated rank primed for its measured step (``fake_ranks.warm_up``'s ``"primed"``: zero gradients and one
optimizer step, the pipeline's stages initialised by the schedule, no forward or backward) measures what it measures
after a real warm step (``"step"``), every window's start and peak to the byte: FSDP, TP, 2D, mixed precision, a
selective strategy and each pipeline schedule, its first and last rank. Cards simulated whole (no depth line), so
each case is one simulation per warm-up: 2-5 s a case, so they run with ``-m slow`` (CI runs them)."""

from __future__ import annotations

import pytest
import torch

from pytest_flashckpt.config.layout import Layout, PipelineSchedule
from pytest_flashckpt.models.cards import load_card
from pytest_flashckpt.simulate.fake_ranks import simulate_rank, warm_up
from pytest_flashckpt.simulate.pipeline import simulate_pipeline_rank

SMALL = {"n_embd": 32, "n_head": 4, "n_kv_head": 2, "intermediate_size": 40, "vocab_size": 128, "block_size": 32}
BYTES = ("peak_bytes", "fwd_bwd_start_bytes", "fwd_bwd_peak_bytes", "optimizer_start_bytes", "optimizer_peak_bytes")


def _common(precision: str, strategy: str, batch: int) -> dict:
    return dict(batch_size=batch, seq_len=16, strategy=strategy, extrapolate=False, precision=precision,
                dtype=torch.bfloat16 if precision == "mixed" else torch.float32)


def _both(simulate, *args, **kwargs) -> tuple[dict, dict]:
    return tuple(simulate(*args, **kwargs, warmup=warmup) for warmup in ("primed", "step"))


def _same_bytes(primed: dict, stepped: dict, keys=BYTES) -> None:
    assert {k: primed[k] for k in keys} == {k: stepped[k] for k in keys}
    # control: the windows are not empty (an all-zero record would be equal under any warm-up)
    assert primed["optimizer_start_bytes"] > primed["fwd_bwd_start_bytes"] > 0
    assert primed["fwd_bwd_peak_bytes"] > primed["fwd_bwd_start_bytes"]


@pytest.mark.slow
@pytest.mark.parametrize(("dp", "tp", "precision", "strategy"), [
    (2, 1, "pure", "none"),
    (2, 2, "mixed", "selective_op"),
])
def test_primed_rank_equals_a_warm_step_fsdp_tp(dp: int, tp: int, precision: str, strategy: str) -> None:
    card = load_card("llama-tiny", **SMALL, n_layer=2)
    primed, stepped = _both(simulate_rank, card, Layout(dp_shard=dp, tp=tp), **_common(precision, strategy, 2 * dp))
    _same_bytes(primed, stepped)


@pytest.mark.slow
@pytest.mark.parametrize(("card_name", "dp", "tp", "precision", "strategy"), [
    ("tiny", 2, 1, "mixed", "full"),
    ("llama-tiny", 1, 2, "pure", "full"),
    ("llama-tiny", 4, 1, "mixed", "every_k"),
])
def test_primed_rank_equals_a_warm_step_more_layouts(card_name, dp, tp, precision, strategy) -> None:
    overrides = SMALL if card_name == "llama-tiny" else {"n_embd": 32, "n_head": 2, "vocab_size": 128, "block_size": 32}
    card = load_card(card_name, **overrides, n_layer=2)
    primed, stepped = _both(simulate_rank, card, Layout(dp_shard=dp, tp=tp), **_common(precision, strategy, 2 * dp))
    _same_bytes(primed, stepped)


def _pipeline(dp: int, tp: int, schedule: str, microbatches: int, stages_per_rank: int, rank: int, precision: str,
              strategy: str) -> tuple[dict, dict]:
    card = load_card("llama-tiny", **SMALL, n_layer=4)
    layout, pipeline = Layout(dp_shard=dp, tp=tp, pp=2), PipelineSchedule(schedule, microbatches, stages_per_rank)
    return _both(simulate_pipeline_rank, card, layout, pipeline, rank=rank,
                 **_common(precision, strategy, 2 * microbatches * dp))


@pytest.mark.slow
def test_primed_pipeline_rank_equals_a_warm_step() -> None:
    """1F1B, the first rank (the receive buffers of its gradients) and the last (its activations' and the loss)."""
    for rank in (0, 1):
        primed, stepped = _pipeline(1, 1, "1f1b", 4, 1, rank, "pure", "none")
        _same_bytes(primed, stepped, (*BYTES, "buffer_bytes"))


@pytest.mark.slow
@pytest.mark.parametrize(("dp", "tp", "schedule", "microbatches", "stages_per_rank", "rank", "precision", "strategy"), [
    (1, 1, "gpipe", 4, 1, 1, "pure", "full"),
    (1, 1, "interleaved_1f1b", 4, 2, 0, "mixed", "selective_op"),
    (1, 1, "interleaved_1f1b", 4, 2, 1, "pure", "none"),
    (2, 1, "1f1b", 4, 1, 0, "mixed", "full"),
    (1, 2, "1f1b", 2, 1, 2, "pure", "none"),
])
def test_primed_pipeline_rank_equals_a_warm_step_more_schedules(dp, tp, schedule, microbatches, stages_per_rank,
                                                                rank, precision, strategy) -> None:
    primed, stepped = _pipeline(dp, tp, schedule, microbatches, stages_per_rank, rank, precision, strategy)
    _same_bytes(primed, stepped, (*BYTES, "buffer_bytes"))


def test_unknown_warm_up_is_refused() -> None:
    with pytest.raises(ValueError, match="warmup must be one of"):
        warm_up(object(), [], "none")
