"""``flashckpt simulate --pp / --cp``: a pipeline stage's and a context-parallel rank's peak on the command line,
the same bytes as the simulation functions the gloo tests check (simulate.pipeline, simulate.context_parallel)."""

from __future__ import annotations

import re

import pytest
import torch

from pytest_flashckpt.cli import main
from pytest_flashckpt.config.layout import Layout, PipelineSchedule
from pytest_flashckpt.models.cards import load_card
from pytest_flashckpt.simulate.pipeline import simulate_first_and_last


def _peak(out: str) -> int:
    return int(re.search(r"per-rank peak: .* \((\d+) bytes\)", out).group(1))


@pytest.mark.slow
def test_pp_prints_the_larger_of_the_first_and_last_stage_of_the_real_schedule(capsys) -> None:
    argv = ["simulate", "--model", "llama-tiny", "--seq", "64", "--batch", "4", "--dtype", "fp32", "--strategy", "full",
            "--world-size", "2", "--pp", "2", "--microbatches", "2", "--device-memory", "1GiB"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "stage of 2 (1f1b, 2 microbatches; the larger of the first and the last pipeline rank, rank 0: " in out
    assert "layout dp_shard 1 x tp 1 x pp 2" in out
    record = simulate_first_and_last(load_card("llama-tiny"), Layout(pp=2), PipelineSchedule("1f1b", 2), batch_size=4,
                                     seq_len=64, strategy="full", dtype=torch.float32)
    assert _peak(out) == record["peak_bytes"] == max(record["ranks"].values()) and set(record["ranks"]) == {0, 1}
    assert main([*argv[:-1], "1KiB"]) == 1  # control: the same stage does not fit a tiny device


@pytest.mark.slow
def test_pp_with_tp_prints_the_stages_with_tensor_parallel_inside(capsys) -> None:
    """``--pp 2 --tp 2`` on 4 ranks: the first and last stages' tp ranks, the same bytes as
    ``simulate_first_and_last`` at that layout, under the stages' peak at tp 1 (control: ``--pp 2`` on 2 ranks)."""
    argv = ["simulate", "--model", "llama-tiny", "--seq", "64", "--batch", "4", "--dtype", "fp32", "--strategy", "full",
            "--world-size", "4", "--pp", "2", "--tp", "2", "--microbatches", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "stage of 2 (1f1b, 2 microbatches, tensor parallel over 2 ranks inside it; the larger of" in out
    assert "layout dp_shard 1 x tp 2 x pp 2 (4 ranks)" in out
    record = simulate_first_and_last(load_card("llama-tiny"), Layout(tp=2, pp=2), PipelineSchedule("1f1b", 2),
                                     batch_size=4, seq_len=64, strategy="full", dtype=torch.float32)
    assert set(record["ranks"]) == {0, 2}  # rank 0 of each stage's tp group
    assert _peak(out) == record["peak_bytes"]
    assert main([*argv[:argv.index("--world-size")], "--world-size", "2", "--pp", "2", "--microbatches", "2"]) == 0
    assert _peak(capsys.readouterr().out) > record["peak_bytes"]


@pytest.mark.slow
def test_cp_prints_a_modelled_ring_rank(capsys) -> None:
    argv = ["simulate", "--model", "llama-tiny", "--seq", "256", "--batch", "1", "--strategy", "full", "--world-size", "2", "--cp", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "one of 2 ranks at 128 tokens with torch's ring attention (modelled" in out and _peak(out) > 0


@pytest.mark.slow
def test_cp_with_fsdp_and_tp_prints_the_fake_rank_of_the_composed_layout(capsys) -> None:
    from pytest_flashckpt.simulate.fake_ranks import simulate_rank

    argv = ["simulate", "--model", "llama-tiny", "--seq", "256", "--batch", "2", "--strategy", "full", "--world-size",
            "8", "--cp", "2", "--tp", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "one of 2 context-parallel ranks at 128 tokens (FSDP2 over dp_shard x cp = 4 ranks, tensor parallel over 2)" in out
    assert "layout dp_shard 2 x tp 2 x cp 2 (8 ranks)" in out
    record = simulate_rank(load_card("llama-tiny"), Layout(dp_shard=2, tp=2, cp=2), batch_size=2, seq_len=256,
                           strategy="full", dtype=torch.bfloat16, foreach=True)
    assert _peak(out) == record["peak_bytes"]


@pytest.mark.slow
def test_cp_inside_pipeline_stages_prints_the_larger_stage_rank(capsys) -> None:
    from pytest_flashckpt.config.layout import PipelineSchedule
    from pytest_flashckpt.simulate.pipeline import simulate_first_and_last

    argv = ["simulate", "--model", "llama-tiny", "--seq", "256", "--batch", "4", "--strategy", "full", "--world-size",
            "4", "--pp", "2", "--cp", "2", "--microbatches", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "context parallel over 2 ranks inside it" in out and "ring attention + fully_shard" in out
    record = simulate_first_and_last(load_card("llama-tiny"), Layout(dp_shard=1, pp=2, cp=2), PipelineSchedule("1f1b", 2),
                                     batch_size=4, seq_len=256, strategy="full", dtype=torch.bfloat16)
    assert _peak(out) == record["peak_bytes"] and sorted(record["ranks"]) == [0, 2]  # the last pipeline rank: 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--world-size", "4", "--pp", "2", "--cp", "2", "--seq", "130"], "sequence 130 is not divisible by 2 x cp = 4"),
        (["--world-size", "4", "--cp", "2", "--tp", "4"], "world size 4 is not divisible by tp 4 x pp 1 x cp 2 = 8"),
        # tensor parallel inside stages: whole heads, no more stages than blocks, a sequence the stages can shard
        (["--world-size", "8", "--pp", "2", "--tp", "4"], "model card 'llama-tiny' has n_head 6, not divisible by tp"),
        (["--world-size", "8", "--pp", "4", "--tp", "2"], "4 pipeline stages (4 ranks x 1 per rank) for 3 blocks"),
        (["--world-size", "4", "--pp", "2", "--tp", "2", "--seq", "127"], "sequence 127 is not divisible by tp"),
        (["--world-size", "4", "--pp", "8"], "world size 4 is not divisible by tp 1 x pp 8 x cp 1 = 8"),
        (["--world-size", "2", "--pp", "2", "--microbatches", "3"], "microbatch"),
        (["--world-size", "2", "--cp", "2", "--seq", "130"], "--cp 2"),
        (["--world-size", "2", "--pp", "2", "--budget", "0.5"], "--strategy budget is not simulated by the engine yet"),
    ],
)
def test_bad_stage_requests_exit_2_naming_the_option(argv, message, capsys) -> None:
    assert main(["simulate", "--model", "llama-tiny", "--seq", "128", "--batch", "4", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not torch.distributed.is_initialized()
