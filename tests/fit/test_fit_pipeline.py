"""Pipeline stages in ``flashckpt fit``: the candidates torch's schedules accept, their memory from the pipeline
simulation (no modelled additions: the schedule's microbatches and FSDP2's kept blocks are simulated), the bubble in
the time model, the command's errors for impossible requests, and one search on the real simulated stages."""

from __future__ import annotations

import pytest
from pytest_flashckpt.cli import main
from pytest_flashckpt.config.errors import InputError
from pytest_flashckpt.config.layout import Layout, PipelineSchedule
from pytest_flashckpt.config.model_card import load_card
from pytest_flashckpt.fit.candidates import Candidate, enumerate_candidates, pp_degrees
from pytest_flashckpt.fit.hardware import DEVICES
from pytest_flashckpt.fit.memory import RankMemoryModel
from pytest_flashckpt.fit.search import FitRequest, search
from pytest_flashckpt.fit.time_model import StepTimeModel

CARD = load_card("llama-tiny")  # 3 blocks, untied head
DEEP = load_card("llama3-70b")
MiB = 2**20


def stage_stand_in(calls: list):
    """A pipeline rank whose state is the even split over stages and shards and whose activations grow with the
    in-flight microbatches (no torch run)."""
    def simulate(card, layout, pipeline, *, batch_size, seq_len, strategy, k, dtype, precision):
        calls.append((layout.dp_shard, layout.pp, pipeline, batch_size, strategy))
        state = card.num_params() * 12 // (layout.dp_shard * layout.pp)
        grads = card.num_params() * 4 // (layout.dp_shard * layout.pp)
        rows = batch_size // layout.dp_shard // pipeline.microbatches
        activations = min(pipeline.microbatches, layout.pp) * rows * seq_len * card.n_embd * 40
        return {"peak_bytes": state + grads + activations, "fwd_bwd_start_bytes": state,
                "fwd_bwd_peak_bytes": state + grads + activations, "optimizer_start_bytes": state + grads,
                "optimizer_peak_bytes": state + grads}
    return simulate


def test_pipeline_candidates_are_what_torchs_schedules_run() -> None:
    found = enumerate_candidates(DEEP, 64, seq_len=8192, global_batch_tokens=128 * 8192, gpus_per_node=8,
                                 pp=(1, 8), schedules=("1f1b", "interleaved_1f1b", "gpipe"))
    staged = [c for c in found if c.pp > 1]
    assert staged and not any(c.reshard_after_forward for c in staged)
    # HSDP inside the stages (reports/spike-hsdp-ranks.md): replicas of a shard group spanning whole nodes; at pp 8
    # a stage's 8 GPUs are one node, so none there
    assert not any(c.dp_replicate > 1 for c in staged)
    two = enumerate_candidates(DEEP, 64, seq_len=8192, global_batch_tokens=128 * 8192, gpus_per_node=8, pp=(2,))
    replicated = [c for c in two if c.dp_replicate > 1]
    assert replicated and all(c.dp_shard * c.tp % 8 == 0 and c.dp * c.tp * c.pp == 64 for c in replicated)
    assert {"hsdp 2x16 x pp 2 (1f1b)", "hsdp 2x2 x tp 8 x pp 2 (1f1b)"} <= {c.describe() for c in replicated}
    assert not any(c.dp_replicate > 1 for c in enumerate_candidates(
        DEEP, 64, seq_len=8192, global_batch_tokens=128 * 8192, gpus_per_node=8, pp=(2,), hsdp=False))
    # tensor parallel inside the stages: every degree of a node that divides the heads (8 kv heads), pp x tp x FSDP
    assert {c.tp for c in staged} == {1, 2, 4, 8}
    assert all(c.dp * c.tp * c.pp == 64 and c.microbatch * c.accumulation == 128 // c.dp for c in staged)
    assert "fsdp 1 x tp 8 x pp 8 (1f1b)" in {c.describe() for c in staged}
    assert all(c.accumulation >= 8 for c in staged if c.schedule == "1f1b")  # a microbatch per stage at least
    assert {c.stages_per_rank for c in staged if c.schedule == "interleaved_1f1b"} == {2}
    assert "fsdp 8 x pp 8 (interleaved_1f1b, 2 stages per rank)" in {c.describe() for c in staged}
    assert [c for c in found if c.pp == 1] == enumerate_candidates(
        DEEP, 64, seq_len=8192, global_batch_tokens=128 * 8192, gpus_per_node=8)  # pp 1 unchanged


def test_a_pipeline_candidate_is_simulated_as_a_pipeline_with_nothing_modelled_on_top() -> None:
    calls: list = []
    memory = RankMemoryModel(CARD, 256, simulate=lambda *a, **k: pytest.fail("the FSDP rank was simulated"),
                             simulate_stage=stage_stand_in(calls))
    c = Candidate(gpus=4, dp_shard=2, tp=1, microbatch=1, accumulation=4, strategy="full", precision="mixed",
                  reshard_after_forward=False, pp=2)
    rank = memory.memory(c)
    assert calls == [(2, 2, PipelineSchedule("1f1b", 4, 1), 1 * 4 * 2, "full")]
    assert rank.source == "simulated" and not any(rank.added.values())  # accumulation and no-reshard are simulated
    flat = Candidate(**{**vars(c), "pp": 1, "dp_shard": 4, "gpus": 4})  # control: FSDP adds both, modelled
    fsdp = RankMemoryModel(CARD, 256, simulate=lambda *a, **k: stage_stand_in([])(
        a[0], Layout(dp_shard=4, pp=1), PipelineSchedule("1f1b", 1), **k)).memory(flat)
    assert fsdp.added["accumulated gradients"] > 0 and fsdp.added["unsharded block parameters"] > 0


def test_hsdp_replicas_inside_stages_share_the_stage_simulation_and_add_an_all_reduce() -> None:
    """A replica's stage rank holds what the stage rank of its shard group holds (measured on gloo ranks, to the
    byte: reports/spike-hsdp-ranks.md), so both read one simulation; the replicas' all-reduce is time only."""
    calls: list = []
    memory = RankMemoryModel(CARD, 256, simulate=lambda *a, **k: pytest.fail("the FSDP rank was simulated"),
                             simulate_stage=stage_stand_in(calls))
    fsdp = Candidate(gpus=4, dp_shard=2, tp=1, microbatch=1, accumulation=4, strategy="full", precision="mixed",
                     reshard_after_forward=False, pp=2)
    hsdp = Candidate(**{**vars(fsdp), "gpus": 8, "dp_replicate": 2})
    assert memory.memory(hsdp) == memory.memory(fsdp) and len(calls) == 1
    times = StepTimeModel(CARD, 256, DEVICES["h100-sxm"])
    assert times.step(hsdp).fsdp_s > times.step(fsdp).fsdp_s


def test_the_bubble_shrinks_with_microbatches_and_virtual_stages() -> None:
    times = StepTimeModel(DEEP, 8192, DEVICES["h100-sxm"])
    base = dict(gpus=64, dp_shard=8, tp=1, strategy="full", precision="mixed", reshard_after_forward=False, pp=8)
    few = times.step(Candidate(**base, microbatch=2, accumulation=8))
    many = times.step(Candidate(**base, microbatch=1, accumulation=16))
    interleaved = times.step(Candidate(**base, microbatch=1, accumulation=16, schedule="interleaved_1f1b", stages_per_rank=2))
    assert few.bubble_fraction == pytest.approx(7 / 8) and many.bubble_fraction == pytest.approx(7 / 16)
    assert interleaved.bubble_fraction == pytest.approx(7 / 32)
    assert many.step_s < few.step_s and interleaved.compute_s == pytest.approx(many.compute_s)
    flat = times.step(Candidate(**{**base, "pp": 1, "dp_shard": 64}, microbatch=1, accumulation=2))
    assert flat.bubble_fraction == 0.0  # control: no pipeline, no bubble
    # a stage computes 1/pp of the blocks per microbatch: the step's compute equals FSDP's over the same tokens
    assert many.compute_s == pytest.approx(flat.compute_s)


def test_the_search_takes_the_pipeline_degrees_and_simulates_stages() -> None:
    calls: list = []
    request = FitRequest(card=CARD, seq_len=256, global_batch_tokens=256 * 16, gpus=(4,), device=DEVICES["h100-sxm"],
                         device_memory=10**12, top=50, max_simulations=50, pp=(1, 2), schedules=("1f1b",))
    (found,) = search(request, simulate=lambda *a, **k: stage_stand_in([])(a[0], Layout(dp_shard=a[1].dp_shard),
                                                                       PipelineSchedule("1f1b", 1), **k),
                      simulate_stage=stage_stand_in(calls))
    staged = [r for r in found.fitting if r.candidate.pp == 2]
    assert staged and len(calls) == len(set(calls)) and {c[1] for c in calls} == {2}  # each simulated once
    assert all(r.time.bubble_fraction == pytest.approx(1 / r.candidate.accumulation) for r in staged)


@pytest.mark.parametrize("args, message", [
    (["--gpus", "4", "--pp", "3"], "--pp 3: does not divide --gpus 4"),
    (["--gpus", "8", "--pp", "4"], "--pp 4: 4 stages for model card 'llama-tiny''s 3 blocks; use --pp 3 or fewer"),
    (["--gpus", "4", "--pp", "2", "--schedules", "zero_bubble"], "--schedules 'zero_bubble': fit simulates"),
    (["--gpus", "4", "--pp", "2", "--global-batch-tokens", str(256 * 2)], "--gpus 4: the global batch of 2 sequences"),
    # tensor parallel inside stages: whole heads, no more stages than blocks, a sequence the stages can shard
    (["--gpus", "12", "--pp", "2", "--tp", "3"], "--tp 3: model card 'llama-tiny' has n_kv_head 2, not divisible by 3"),
    (["--gpus", "16", "--pp", "4", "--tp", "2"], "--pp 4: 4 stages for model card 'llama-tiny''s 3 blocks"),
    (["--gpus", "4", "--pp", "2", "--tp", "2", "--seq", "255", "--global-batch-tokens", str(255 * 16)],
     "--tp 2 with --pp 2: layout tp 2 inside pipeline stages: sequence 255 is not divisible by tp"),
])
def test_impossible_pipeline_requests_are_one_line_errors(args, message, capsys) -> None:
    argv = ["fit", "--model", "llama-tiny", "--seq", "256", "--global-batch-tokens", str(256 * 16), "--tp", "1", *args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_tied_head_is_refused_for_a_pipeline_and_left_out_by_default() -> None:
    tied = load_card("llama-tiny", tie_word_embeddings=True)
    with pytest.raises(InputError, match=r"--pp 2: model card 'llama-tiny' ties its head"):
        pp_degrees(tied, 4, (2,))
    assert pp_degrees(tied, 4) == [1] and pp_degrees(CARD, 4) == [1, 2]  # control: untied, 3 blocks


@pytest.mark.slow
def test_the_search_on_the_real_simulated_stages_reads_the_larger_of_first_and_last() -> None:
    from pytest_flashckpt.fit import memory as memory_module

    records: list = []

    def both_ranks(*args, **kwargs):  # fit.memory's own first-and-last simulation, its record kept
        records.append(memory_module._simulate_stages(*args, **kwargs))
        return records[-1]

    card = load_card("llama-tiny", n_layer=2)
    request = FitRequest(card=card, seq_len=32, global_batch_tokens=32 * 2, gpus=(2,), device=DEVICES["h100-sxm"],
                         device_memory=64 * MiB, strategies=("full",), tp=(1,), top=1, max_simulations=1, pp=(2,),
                         schedules=("1f1b",))
    (found,) = search(request, simulate=lambda *a, **k: pytest.fail("the FSDP rank was simulated"),
                      simulate_stage=both_ranks)
    (chosen,) = found.fitting
    assert (chosen.candidate.pp, chosen.candidate.dp_shard, chosen.candidate.accumulation) == (2, 1, 2)
    (record,) = records
    assert sorted(record["ranks"]) == [0, 1] and record["ranks"][0] != record["ranks"][1]  # the head is on rank 1
    assert chosen.memory.peak_bytes == max(record["ranks"].values()) == record["peak_bytes"]


def test_tensor_parallel_stages_are_candidates_only_where_the_stages_can_shard() -> None:
    """The default tp degrees (those dividing the heads: 1 and 2 here) inside stages at a sequence tp 2 divides
    (control), and at one it does not, where FSDP x pp candidates remain (a requested --tp 2 is an error there)."""
    kwargs = dict(gpus_per_node=8, pp=(2,), schedules=("1f1b",))
    even = enumerate_candidates(CARD, 4, seq_len=256, global_batch_tokens=256 * 16, **kwargs)
    assert {c.tp for c in even} == {1, 2} and {c.describe() for c in even if c.tp == 2} == {"fsdp 1 x tp 2 x pp 2 (1f1b)"}
    odd = enumerate_candidates(CARD, 4, seq_len=255, global_batch_tokens=255 * 16, **kwargs)
    assert odd and {c.tp for c in odd} == {1}


@pytest.mark.slow
def test_the_search_simulates_a_tensor_parallel_pipeline_at_its_first_and_last_rank() -> None:
    """fit at pp 2 x tp 2 on 4 GPUs: fit.memory's own simulation of the first and the last pipeline rank (ranks 0
    and 2 of the (pp, dp_shard, tp) mesh), both in this process under fake mode."""
    from pytest_flashckpt.fit import memory as memory_module

    records: list = []

    def both_ranks(*args, **kwargs):
        records.append(memory_module._simulate_stages(*args, **kwargs))
        return records[-1]

    card = load_card("llama-tiny", n_layer=2)
    request = FitRequest(card=card, seq_len=32, global_batch_tokens=32 * 2, gpus=(4,), device=DEVICES["h100-sxm"],
                         device_memory=64 * MiB, strategies=("full",), tp=(2,), top=1, max_simulations=1, pp=(2,),
                         schedules=("1f1b",))
    (found,) = search(request, simulate=lambda *a, **k: pytest.fail("the FSDP rank was simulated"),
                      simulate_stage=both_ranks)
    (chosen,) = found.fitting
    assert (chosen.candidate.pp, chosen.candidate.tp, chosen.candidate.dp_shard) == (2, 2, 1)
    (record,) = records
    assert sorted(record["ranks"]) == [0, 2]
    assert chosen.memory.peak_bytes == max(record["ranks"].values()) == record["peak_bytes"]
