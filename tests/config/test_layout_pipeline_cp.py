"""The pipeline and context-parallel axes of a layout: accepted, and every impossible request refused before
anything is built with one line naming the axis and the fix (torch-free: ``config.layout``)."""

from __future__ import annotations

import pytest

from pytest_flashckpt.config.layout import Layout, PipelineSchedule


def test_pipeline_and_context_parallel_axes_are_accepted_and_counted() -> None:
    layout = Layout(dp_shard=2, tp=2, pp=4, cp=2)
    assert layout.world_size == 32 and layout.describe() == "dp_shard 2 x tp 2 x pp 4 x cp 2"
    assert Layout(dp_shard=2, tp=2).describe() == "dp_shard 2 x tp 2"  # the 2D name unchanged
    assert Layout.for_world(16, tp=2, pp=2, cp=2) == Layout(dp_shard=2, tp=2, pp=2, cp=2)


@pytest.mark.parametrize(
    "request_,match",
    [
        (lambda: Layout(pp=4).check_stages(3), r"layout pp 4: 4 pipeline stages .* for 3 blocks; use at most 3"),
        (lambda: Layout(pp=2).check_stages(3, stages_per_rank=2), r"4 pipeline stages \(2 ranks x 2 per rank\)"),
        (lambda: PipelineSchedule("1f1b", 3).check(Layout(dp_shard=2, pp=2), batch_size=8, n_blocks=4),
         r"3 microbatches do not divide the batch of a data-parallel rank \(4 rows = batch 8 / dp_shard 2\)"),
        (lambda: PipelineSchedule("1f1b", 2).check(Layout(pp=4), batch_size=8, n_blocks=4),
         r"schedule 1f1b needs at least one microbatch per stage \(4\), got 2; use microbatches >= 4"),
        (lambda: PipelineSchedule("interleaved_1f1b", 7, 2).check(Layout(pp=2), batch_size=14, n_blocks=4),
         r"interleaved_1f1b .* 7 microbatches are not a whole number of rounds; use a multiple of 2"),
        (lambda: PipelineSchedule("gpipe", 2, stages_per_rank=2), r"gpipe runs one stage per rank.*interleaved_1f1b"),
        (lambda: PipelineSchedule("zero_bubble"), r"schedule 'zero_bubble' is unknown; use one of gpipe, 1f1b"),
        (lambda: PipelineSchedule(microbatches=0), r"microbatches must be a positive integer, got 0"),
        (lambda: Layout(cp=4).check_sequence(100), r"layout cp 4: sequence 100 is not divisible by 2 x cp = 8"),
        (lambda: Layout(cp=3).check_sequence(100, load_balanced=False), r"sequence 100 is not divisible by cp 3"),
        (lambda: Layout(dp_shard=2, pp=2).check_world(2), r"dp_shard 2 x tp 1 x pp 2 needs 4 ranks.*make dp_shard x tp x pp"),
        (lambda: Layout(cp=0), r"layout cp must be a positive integer, got 0"),
    ],
)
def test_impossible_requests_are_refused_naming_the_axis(request_, match) -> None:
    with pytest.raises(ValueError, match=match):
        request_()


def test_possible_requests_pass_the_same_checks() -> None:  # the control of the refusals above
    PipelineSchedule("1f1b", 4).check(Layout(dp_shard=2, pp=4), batch_size=8, n_blocks=4)
    PipelineSchedule("interleaved_1f1b", 8, 2).check(Layout(pp=4), batch_size=8, n_blocks=8)
    PipelineSchedule("gpipe", 1).check(Layout(pp=2), batch_size=3, n_blocks=2)
    Layout(cp=4).check_sequence(8192)
    Layout(cp=3).check_sequence(99, load_balanced=False)
    Layout(pp=3).check_stages(3)


def test_the_tensor_parallel_mesh_refuses_pipeline_axes() -> None:
    from pytest_flashckpt.distributed import tensor_parallel

    with pytest.raises(ValueError, match=r"layout dp_shard 1 x tp 2 x pp 2: tensor parallel is composed with dp_shard and cp here"):
        tensor_parallel.make_mesh(Layout(tp=2, pp=2))
    # (the pipeline mesh takes every axis: tests/distributed/test_pipeline_cp.py builds pp x cp on gloo ranks)
