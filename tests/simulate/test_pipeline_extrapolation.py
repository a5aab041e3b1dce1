"""A pipeline stage read off the line through fewer blocks per stage (``simulate.pipeline`` with
``layer_extrapolation.sample_depths(..., stages=)``) equals the whole card's stage to the byte, so does a schedule of
many microbatches read off the line through fewer (``sample_microbatches``), and the resize-tracking
probe (``simulate.rank_probe``) reads what the gloo ranks' probe (``distributed.memory``) reads on a stage. The cheap
case runs by default (in process, as tests/simulate/test_pipeline_sim.py), the others with ``-m slow``."""

from __future__ import annotations

import pytest
import torch

from pytest_flashckpt.config.layout import SCHEDULES, Layout, PipelineSchedule
from pytest_flashckpt.distributed.memory import ShardedLiveTensorProbe
from pytest_flashckpt.models.cards import load_card
from pytest_flashckpt.simulate.layer_extrapolation import sample_depths
from pytest_flashckpt.simulate.pipeline import STAGE_KEYS, STEADY_ROUNDS, sample_microbatches, simulate_pipeline_rank

SMALL = {"n_embd": 32, "n_head": 2, "n_kv_head": 1, "intermediate_size": 40, "vocab_size": 128, "block_size": 32}
BYTES = ("peak_bytes", *STAGE_KEYS)


def _ways(n_layer: int, dp: int, pp: int, schedule: str, microbatches: int, strategy: str, precision: str,
          stages_per_rank: int = 1, rank: int = 0, exact: bool = True) -> dict[str, dict]:
    card = load_card("llama-tiny", **SMALL, n_layer=n_layer)
    common = dict(batch_size=2 * microbatches * dp, seq_len=16, strategy=strategy,
                  dtype=torch.bfloat16 if precision == "mixed" else torch.float32, precision=precision, rank=rank)
    layout, pipeline = Layout(dp_shard=dp, pp=pp), PipelineSchedule(schedule, microbatches, stages_per_rank)
    ways = {"extrapolated": {}, "whole": {"extrapolate": False}}
    if exact:
        ways["exact_probe"] = {"extrapolate": False, "probe_class": ShardedLiveTensorProbe}
    return {way: simulate_pipeline_rank(card, layout, pipeline, **common, **kwargs) for way, kwargs in ways.items()}


def _check(records: dict[str, dict]) -> None:
    whole, extrapolated = records["whole"], records["extrapolated"]
    assert whole["extrapolated"] is False and whole["simulated_depths"] == [whole["n_layer"]]
    assert extrapolated["extrapolated"] is True, extrapolated["simulated_depths"]
    assert max(extrapolated["simulated_depths"]) < whole["n_layer"] == extrapolated["n_layer"]
    assert {k: extrapolated[k] for k in BYTES} == {k: whole[k] for k in BYTES}
    assert extrapolated["stages"] == whole["stages"]
    if "exact_probe" in records:
        assert {k: records["exact_probe"][k] for k in BYTES} == {k: whole[k] for k in BYTES}


@pytest.mark.slow
def test_extrapolated_stage_equals_the_whole_stage_to_the_byte() -> None:
    """pp 2, 1F1B over 2 microbatches, full checkpointing; 16 blocks (8 per stage): the samples are 2, 4 and 6
    blocks (1, 2, 3 per stage)."""
    records = _ways(16, 1, 2, "1f1b", 2, "full", "pure", exact=False)
    assert records["extrapolated"]["simulated_depths"] == [2, 4, 6]
    _check(records)
    # control: the byte counts move with the depth (the equality above can fail): no sample holds the card's peak
    samples = records["extrapolated"]["sample_peaks"]
    assert len(samples) == 3 and records["whole"]["peak_bytes"] not in samples.values()


@pytest.mark.slow  # about a minute on two shared cores: every schedule, strategy, precision and the last rank
@pytest.mark.parametrize(
    ("n_layer", "dp", "pp", "schedule", "microbatches", "strategy", "precision", "stages_per_rank", "rank"),
    [
        (17, 2, 2, "1f1b", 4, "full", "mixed", 1, 0),  # FSDP in the stage, the odd block on stage 0
        (16, 1, 2, "gpipe", 4, "none", "pure", 1, 0),
        (16, 1, 2, "1f1b", 2, "selective_op", "mixed", 1, 1),  # the last stage: the head, activation buffers
        (40, 2, 2, "1f1b", 4, "every_k", "pure", 1, 0),  # k 2: 4, 6, 8 blocks per stage
        (29, 1, 2, "interleaved_1f1b", 4, "full", "mixed", 2, 0),
        (29, 2, 4, "1f1b", 4, "none", "mixed", 1, 1),
    ],
)
def test_extrapolated_stage_equals_the_whole_stage_on_every_schedule(n_layer, dp, pp, schedule, microbatches,
                                                                      strategy, precision, stages_per_rank, rank) -> None:
    _check(_ways(n_layer, dp, pp, schedule, microbatches, strategy, precision, stages_per_rank, rank * dp))


def test_stage_depths_add_a_block_to_every_stage_and_keep_the_odd_ones() -> None:
    assert sample_depths(80, "full", 2, stages=8, first=1) == [8, 16, 24, 32, 40]
    assert sample_depths(126, "none", 2, stages=8, first=1) == [14, 22, 30, 38, 46]  # stages 0-5 hold one more
    assert sample_depths(80, "every_k", 2, stages=4, first=1) == [16, 24, 32, 40, 48]  # 4 blocks per stage, step k
    assert sample_depths(24, "full", 2, stages=8, first=1) == []  # 3 per stage: simulated whole
    assert sample_depths(80, "full", 2) == [3, 4, 5, 6, 7]  # one stage: unchanged


@pytest.mark.slow
def test_samples_that_cost_as_much_as_the_card_are_not_run() -> None:
    """8 blocks over 2 stages of 1F1B: samples 2, 4, 6 would run 12 stage blocks for the card's 8: whole."""
    record = simulate_pipeline_rank(load_card("llama-tiny", **SMALL, n_layer=8), Layout(pp=2),
                                    PipelineSchedule("1f1b", 4), batch_size=8, seq_len=16)
    assert record["extrapolated"] is False and record["simulated_depths"] == [8]


def _microbatch_ways(dp: int, schedule: str, microbatches: int, strategy: str, precision: str,
                     stages_per_rank: int = 1, rank: int = 0, n_layer: int = 2, pp: int = 2) -> dict[str, dict]:
    card = load_card("llama-tiny", **SMALL, n_layer=n_layer)
    common = dict(batch_size=2 * microbatches * dp, seq_len=16, strategy=strategy,
                  dtype=torch.bfloat16 if precision == "mixed" else torch.float32, precision=precision, rank=rank)
    layout, pipeline = Layout(dp_shard=dp, pp=pp), PipelineSchedule(schedule, microbatches, stages_per_rank)
    return {"line": simulate_pipeline_rank(card, layout, pipeline, **common),
            "whole": simulate_pipeline_rank(card, layout, pipeline, extrapolate=False, **common)}


def _check_microbatches(ways: dict[str, dict], microbatches: int) -> None:
    line, whole = ways["line"], ways["whole"]
    assert whole["microbatches_extrapolated"] is False and whole["simulated_microbatches"] == [microbatches]
    assert line["microbatches_extrapolated"] is True and max(line["simulated_microbatches"]) < microbatches
    assert line["microbatches"] == whole["microbatches"] == microbatches
    assert {k: line[k] for k in BYTES} == {k: whole[k] for k in BYTES}


@pytest.mark.slow
def test_many_microbatches_read_off_their_line_equal_the_whole_schedule_on_the_last_stage() -> None:
    """pp 2, GPipe over 10 microbatches, the last stage (the head, its logits and the losses): samples 2, 3, 4
    (1F1B's start at 2 rounds, 4 microbatches: the slow cases below). Measured on 1F1B before ``return_outputs=False`` (distributed.pipeline): torch's schedule kept
    every microbatch's logits alive there, the peak grew 20,996 B per microbatch up to 5 and 37,380 B from 7 on
    (the line through 2, 3, 4 read 629,764 B where the whole step peaked at 737,920 B at 12 microbatches), and a line
    through the first samples missed it; now it grows by the microbatch's inputs and loss alone."""
    ways = _microbatch_ways(1, "gpipe", 10, "full", "pure", rank=1)
    assert ways["line"]["simulated_microbatches"] == [2, 3, 4]
    _check_microbatches(ways, 10)
    # control: the byte counts move with the microbatches (the equality above can fail)
    samples = ways["line"]["microbatch_sample_peaks"]
    assert len(samples) >= 3 and ways["whole"]["peak_bytes"] > max(samples.values())


@pytest.mark.slow  # every schedule, FSDP in the stage, mixed precision, the first rank
@pytest.mark.parametrize(
    ("dp", "schedule", "microbatches", "strategy", "precision", "stages_per_rank", "rank", "pp"),
    [
        (1, "gpipe", 12, "none", "pure", 1, 0, 2),
        (1, "1f1b", 16, "none", "pure", 1, 0, 2),
        (2, "1f1b", 16, "none", "mixed", 1, 2, 2),  # FSDP inside the last stage
        (1, "interleaved_1f1b", 24, "full", "mixed", 2, 0, 2),
        # the first stage of 8 holds one activation more from 15 microbatches on (2 pp - 1): from 8 samples, the line
        # through 9-14 missed the step's peak at 64 by one activation, as it missed Llama-3-70B's at pp 8 by 128 MiB
        (1, "1f1b", 64, "full", "mixed", 1, 0, 8),
    ],
)
def test_many_microbatches_read_off_their_line_on_every_schedule(dp, schedule, microbatches, strategy, precision,
                                                                 stages_per_rank, rank, pp) -> None:
    _check_microbatches(_microbatch_ways(dp, schedule, microbatches, strategy, precision, stages_per_rank, rank,
                                         n_layer=max(4, pp) * stages_per_rank, pp=pp), microbatches)


def test_microbatch_samples_start_past_the_warm_up_and_step_by_rounds() -> None:
    assert set(STEADY_ROUNDS) == set(SCHEDULES)  # a new schedule states where its growth settles
    assert sample_microbatches(Layout(pp=8), PipelineSchedule("interleaved_1f1b", 128, 2)) == [16, 24, 32, 40, 48]
    assert sample_microbatches(Layout(pp=4), PipelineSchedule("1f1b", 32)) == [8, 9, 10, 11, 12]  # 2 rounds
    assert sample_microbatches(Layout(pp=2), PipelineSchedule("gpipe", 64)) == [2, 3, 4, 5, 6]
    assert sample_microbatches(Layout(pp=4), PipelineSchedule("1f1b", 24)) == []  # 8+9+10 >= 24: run whole
    assert sample_microbatches(Layout(pp=8), PipelineSchedule("interleaved_1f1b", 32, 2)) == []
