"""A pipeline candidate's first and last rank simulated side by side (``simulate.pipeline.simulate_side_by_side``:
the last rank in a spawned process while this one simulates the first) give the records they give one after the
other, byte for byte, and a rank's refusal still reaches the caller (issue 32 item 6, reports/side-by-side-ranks.md).

The records compared leave out the ``*_s`` wall times (two runs never read the same clock); every byte count, the
ranks' peaks, the phase of the peak and the extrapolation's samples are compared whole. A spawned process costs an
import of torch, hence the slow tier; the default tier checks the plain path and the job count."""

from __future__ import annotations

import dataclasses
import functools
import os

import pytest
import torch

from pytest_flashckpt.config.layout import Layout, PipelineSchedule
from pytest_flashckpt.models.cards import load_card
from pytest_flashckpt.simulate import pipeline
from pytest_flashckpt.simulate.pipeline import side_by_side_jobs, simulate_first_and_last, simulate_side_by_side

TIMES = ("layout_s", "warm_step_s", "measured_step_s", "seconds")


def _bytes_only(record: dict) -> dict:
    return {key: value for key, value in record.items() if key not in TIMES}


def _rank_record(rank: int, fail_on: int | None = None) -> dict:
    """A stand-in rank that records which process ran it (module level: it must pickle for a spawned process)."""
    if rank == fail_on:
        raise ValueError(f"rank {rank}: refused (a stand-in's reason)")
    return {"rank": rank, "pid": os.getpid()}


@pytest.mark.slow
@pytest.mark.parametrize("layout, schedule", [
    (Layout(pp=2), PipelineSchedule("1f1b", 4)),
    (Layout(dp_shard=2, pp=2), PipelineSchedule("interleaved_1f1b", 4, stages_per_rank=2)),
], ids=["pp2-1f1b", "fsdp2xpp2-interleaved"])
def test_side_by_side_ranks_equal_the_ranks_one_after_the_other(layout, schedule) -> None:
    card = dataclasses.replace(load_card("llama-tiny"), n_layer=4)  # 4 stages of one block for the interleaved one
    kwargs = dict(batch_size=4 * layout.dp_shard, seq_len=64, strategy="full", k=2, dtype=torch.float32,
                  precision="pure")
    alone = simulate_first_and_last(card, layout, schedule, jobs=1, **kwargs)
    side_by_side = simulate_first_and_last(card, layout, schedule, jobs=2, **kwargs)
    assert len(alone["ranks"]) == 2  # two ranks, so the second did run in the spawned process
    assert _bytes_only(side_by_side) == _bytes_only(alone)


@pytest.mark.slow
def test_the_later_ranks_run_in_another_process_and_their_refusal_is_raised_here() -> None:
    records = simulate_side_by_side(_rank_record, [0, 3], jobs=2)
    assert [r["rank"] for r in records] == [0, 3]
    assert records[0]["pid"] == os.getpid() and records[1]["pid"] != os.getpid()
    with pytest.raises(ValueError, match="rank 3: refused"):
        simulate_side_by_side(functools.partial(_rank_record, fail_on=3), [0, 3], jobs=2)


def test_one_job_or_one_rank_runs_here_in_order() -> None:
    assert simulate_side_by_side(_rank_record, [0, 3], jobs=1) == [{"rank": 0, "pid": os.getpid()},
                                                                    {"rank": 3, "pid": os.getpid()}]
    assert simulate_side_by_side(_rank_record, [0], jobs=2) == [{"rank": 0, "pid": os.getpid()}]


def test_fit_simulates_two_ranks_at_once_only_where_it_may_use_two_cores(monkeypatch) -> None:
    monkeypatch.setattr(pipeline.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert side_by_side_jobs() == 2
    monkeypatch.setattr(pipeline.os, "sched_getaffinity", lambda pid: {0}, raising=False)  # taskset -c 0
    assert side_by_side_jobs() == 1
