"""Context parallel in ``flashckpt fit``: cp composed as torchtitan composes it (FSDP2 over ``dp_shard x cp``, tensor
parallel inside, HSDP replicas), its rank simulated by the fake-rank engine with torch's ring attention, the ring's
K/V exchange in the time model, and the errors."""

from __future__ import annotations

import pytest

from pytest_flashckpt.cli import main
from pytest_flashckpt.config.errors import InputError
from pytest_flashckpt.config.model_card import load_card
from pytest_flashckpt.fit.candidates import Candidate, cp_degrees, enumerate_candidates, state_lower_bound
from pytest_flashckpt.fit.hardware import DEVICES
from pytest_flashckpt.fit.memory import RankMemoryModel, block_parameters
from pytest_flashckpt.fit.search import FitRequest, search
from pytest_flashckpt.fit.time_model import StepTimeModel

CARD = load_card("llama-tiny")
SMALL = load_card("llama3.2-1b")


def rank_stand_in(calls: list):
    def simulate(card, layout, *, batch_size, seq_len, strategy, k, dtype, precision):
        calls.append((layout.dp_shard, layout.tp, layout.cp, batch_size, seq_len, strategy, precision))
        state = card.num_params() * 8 // (layout.dp_shard * layout.cp * layout.tp)
        fwd_bwd = state + batch_size * seq_len // (layout.cp * layout.dp_shard) * 1000
        return {"fwd_bwd_start_bytes": state, "fwd_bwd_peak_bytes": fwd_bwd, "optimizer_start_bytes": 2 * state,
                "optimizer_peak_bytes": 3 * state, "peak_bytes": max(fwd_bwd, 3 * state)}
    return simulate


def test_cp_degrees_start_at_long_sequences_and_requested_ones_are_checked() -> None:
    assert cp_degrees(SMALL, 8, 8192) == [] and cp_degrees(SMALL, 8, 131072) == [2, 4, 8]
    assert cp_degrees(SMALL, 4, 131072) == [2, 4]  # control: 8 does not divide 4 GPUs
    with pytest.raises(InputError, match=r"--cp 3: does not divide --gpus 4"):
        cp_degrees(SMALL, 4, 8192, (3,))
    with pytest.raises(InputError, match=r"--cp 4: --seq 100 is not divisible by 2 x cp = 8"):
        cp_degrees(SMALL, 4, 100, (4,))


def test_cp_candidates_shard_over_dp_shard_x_cp_with_tp_inside_in_either_precision() -> None:
    found = enumerate_candidates(SMALL, 8, seq_len=131072, global_batch_tokens=4 * 131072, gpus_per_node=8,
                                 precisions=("pure", "mixed"), cp=(2, 4))
    contexted = [c for c in found if c.cp > 1]
    assert contexted and {c.precision for c in contexted} == {"pure", "mixed"} and {c.pp for c in contexted} == {1}
    assert all(c.dp * c.cp * c.tp == 8 and c.microbatch * c.accumulation * c.dp == 4 for c in contexted)
    described = {c.describe() for c in contexted}
    assert {"fsdp 4 x cp 2", "fsdp 2 x cp 4", "fsdp 1 x tp 2 x cp 4", "fsdp 2 x tp 2 x cp 2",
            "fsdp 1 x tp 4 x cp 2"} <= described
    assert "fsdp 1 x tp 8 x cp 2" not in described  # control: cp x tp is more than the GPUs
    assert not [d for d in described if d.startswith("hsdp")]  # one node: HSDP replicas span whole nodes
    two_nodes = enumerate_candidates(SMALL, 16, seq_len=131072, global_batch_tokens=8 * 131072, gpus_per_node=8,
                                     precisions=("mixed",), cp=(2,))
    assert "hsdp 2x4 x cp 2" in {c.describe() for c in two_nodes}
    # the exact state bound counts the cp ranks among the shards
    one = next(c for c in contexted if c.describe() == "fsdp 2 x cp 4" and c.precision == "pure")
    assert state_lower_bound(SMALL.num_params(), one) == -(-SMALL.num_params() // 8) * 8


def test_cp_inside_pipeline_stages_is_searched_and_simulated_as_a_stage_rank_with_the_ring() -> None:
    """Llama 3's 128K layout (tp x cp x pp x dp): cp candidates with stages, each schedule the pipeline takes, the
    stage rank simulated with cp in its layout (simulate.pipeline runs the ring inside the stages)."""
    found = enumerate_candidates(SMALL, 16, seq_len=131072, global_batch_tokens=8 * 131072, gpus_per_node=8,
                                 precisions=("mixed",), cp=(2,), pp=(1, 2), strategies=("full",))
    staged = [c for c in found if c.cp > 1 and c.pp > 1]
    assert staged and all(c.dp * c.cp * c.tp * c.pp == 16 and not c.reshard_after_forward for c in staged)
    assert {c.schedule for c in staged} == {"1f1b", "interleaved_1f1b"}
    assert all(c.microbatch * c.accumulation * c.dp == 8 for c in staged)
    assert "fsdp 2 x tp 2 x pp 2 (1f1b) x cp 2" in {c.describe() for c in staged}
    calls = []

    def stage(card, layout, pipeline, **kwargs):
        calls.append((layout.dp_shard, layout.tp, layout.pp, layout.cp, pipeline.microbatches, kwargs["batch_size"]))
        return {"fwd_bwd_start_bytes": 10, "fwd_bwd_peak_bytes": 40, "optimizer_start_bytes": 20,
                "optimizer_peak_bytes": 30, "peak_bytes": 40}

    one = next(c for c in staged if c.describe() == "fsdp 2 x tp 2 x pp 2 (1f1b) x cp 2")
    RankMemoryModel(SMALL, 131072, simulate_stage=stage).memory(one)
    assert calls == [(2, 2, 2, 2, one.accumulation, one.microbatch * one.accumulation * 2)]


def test_a_cp_rank_is_the_fake_rank_of_its_dp_shard_x_cp_x_tp_layout() -> None:
    calls: list = []
    memory = RankMemoryModel(SMALL, 131072, simulate=rank_stand_in(calls))
    base = dict(gpus=8, dp_shard=2, tp=2, microbatch=1, strategy="full", precision="mixed", cp=2)
    one = memory.memory(Candidate(**base, accumulation=1))
    two = memory.memory(Candidate(**base, accumulation=2))
    kept = memory.memory(Candidate(**base, accumulation=1, reshard_after_forward=False))
    assert calls == [(2, 2, 2, 2, 131072, "full", "mixed")]  # one simulation; the rest is modelled on top
    assert one.source == "simulated" and two.added["accumulated gradients"] == one.gradient_bytes
    # FSDP2's group is dp_shard x cp = 4: a rank keeping the gathered blocks holds 3/4 of a TP rank's blocks
    assert kept.added["unsharded block parameters"] == block_parameters(SMALL) // 2 * 2 * 3 // 4


def test_the_ring_is_on_the_critical_path_and_compute_is_shared() -> None:
    times = StepTimeModel(SMALL, 131072, DEVICES["h100-sxm"])
    base = dict(gpus=8, dp_shard=1, tp=1, microbatch=1, accumulation=1, strategy="full", precision="pure")
    ring = times.step(Candidate(**base, dp_replicate=2, cp=4))
    alone = times.step(Candidate(**{**base, "gpus": 2}, dp_replicate=2))  # control: no cp, no ring
    assert alone.tp_s == 0.0 and ring.tp_s > 0.0
    assert ring.compute_s == pytest.approx(alone.compute_s / 4)


@pytest.mark.slow
def test_the_search_on_the_real_cp_rank_reads_the_simulated_fake_rank() -> None:
    import torch

    from pytest_flashckpt.config.layout import Layout
    from pytest_flashckpt.simulate.fake_ranks import simulate_rank

    card = load_card("llama-tiny", n_layer=1)
    request = FitRequest(card=card, seq_len=256, global_batch_tokens=256, gpus=(2,), device=DEVICES["h100-sxm"],
                         device_memory=2**30, strategies=("full",), precisions=("pure",), tp=(1,), top=5,
                         max_simulations=5, cp=(2,))
    (found,) = search(request)
    ringed = [r for r in found.fitting if r.candidate.cp == 2]
    assert {r.candidate.reshard_after_forward for r in ringed} == {True, False}  # FSDP2 over the 2 cp ranks
    (ringed,) = [r for r in ringed if r.candidate.reshard_after_forward]  # the simulated rank itself, nothing added
    expected = simulate_rank(card, Layout(cp=2), batch_size=1, seq_len=256, strategy="full", dtype=torch.bfloat16)
    assert ringed.memory.simulated_peak_bytes == expected["peak_bytes"] and ringed.memory.source == "simulated"


@pytest.mark.parametrize("args, message", [
    (["--gpus", "4", "--cp", "3"], "--cp 3: does not divide --gpus 4"),
    (["--gpus", "4", "--cp", "4", "--seq", "100", "--global-batch-tokens", "400"], "--cp 4: --seq 100 is not divisible"),
])
def test_impossible_cp_requests_are_one_line_errors(args, message, capsys) -> None:
    argv = ["fit", "--model", "llama-tiny", "--seq", "256", "--global-batch-tokens", str(256 * 16), *args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_search_that_ran_out_of_simulations_says_so_instead_of_none_fits(capsys) -> None:
    """A candidate that fits but was never simulated (the budget spent on faster ones that did not) is not "none
    fits": the summary names the layouts left unsimulated and the option to raise."""
    from pytest_flashckpt.fit.command import describe
    from pytest_flashckpt.fit.model_input import ModelInput

    calls: list = []
    stand_in = rank_stand_in(calls)

    def simulate(card, layout, **kw):  # the fastest layouts (tp 1) do not fit; the others would
        record = stand_in(card, layout, **kw)
        return {k: v * (10**6 if layout.tp == 1 else 1) for k, v in record.items()}

    request = FitRequest(card=SMALL, seq_len=131072, global_batch_tokens=4 * 131072, gpus=(8,),
                         device=DEVICES["h100-sxm"], device_memory=80 * 2**30, strategies=("full",),
                         precisions=("pure",), top=1, max_simulations=1, cp=(2,), tp=(1, 2))
    (found,) = search(request, simulate=simulate)
    assert not found.fitting and found.untried > 0 and found.simulations == 1
    lines = describe(request, ModelInput(SMALL, "card llama3.2-1b"), [found])
    assert f"none of those simulated fits, {found.untried} layouts left unsimulated (raise --max-simulations)" in lines[-1]
