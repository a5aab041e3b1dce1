"""One registry for every name: a strategy added to a scratch registry reaches the suite, ``flashckpt simulate``,
the FLOP closed form and the report, and one the simulation cannot run is refused there with its reason. The opt-in
simulators (fake ranks, fit, compiled) take a scratch strategy whose row sets their attribute and refuse one whose
row does not, naming the attribute: their lists are derived from the registry (a literal list would not grow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fresh_python import run_together

SCRIPT = Path(__file__).with_name("scratch_strategy.py")


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> dict:
    return run_together({"scratch": [SCRIPT, tmp_path_factory.mktemp("scratch")]})["scratch"]


@pytest.mark.slow
def test_a_scratch_strategy_reaches_every_consumer_of_the_registry(out):
    assert out["suite_blocks"] == [0, 1]  # the suite's scenario, validated and preflighted, planned 2 of 4 blocks
    # the closed form counts the plan's replays: measured == arithmetic, between none and full (a control each way)
    assert out["measured_flops"] == out["closed_form_flops"]
    assert out["none_flops"] < out["closed_form_flops"] < out["full_flops"]
    simulated = out["simulate_scratch_first_half"]
    assert simulated["status"] == 0 and "strategy scratch_first_half" in simulated["stdout"], simulated
    refused = out["simulate_scratch_on_host"]
    assert refused["status"] == 2 and "--strategy scratch_on_host: the scratch reason it is refused" in refused["stderr"], refused
    peak, why = out["report_peak"]
    assert peak > 0 and why == ""
    assert out["report_refused"] == [None, "the scratch_on_host strategy is not simulated here"]


@pytest.mark.slow
def test_a_scratch_strategy_reaches_the_opt_in_simulators_only_with_their_attribute(out):
    # in: the row sets runs_on_fake_ranks, fit_order 2 (after every_k: equal orders keep the registry's order) and
    # simulated_compiled "traced" (before the partitioner's and the planned policies' strategies)
    assert out["layout_strategies"] == ["none", "full", "every_k", "selective_op", "scratch_odd_blocks"]
    assert out["fit_strategies"] == ["none", "selective_op", "every_k", "scratch_odd_blocks", "full"]
    assert out["compiled_strategies"] == ["none", "full", "every_k", "selective_op", "scratch_odd_blocks",
                                          "compile_budget", "budget"]
    ran = out["tp2_scratch_odd_blocks"]  # flashckpt simulate --tp 2: checked, then laid out by the engine
    assert ran["status"] == 0 and "strategy scratch_odd_blocks, layout dp_shard 1 x tp 2" in ran["stdout"], ran
    assert "scratch_odd_blocks" in out["fit_candidate_strategies"]
    assert out["fit_replays_of_5_blocks"] == [2, 0]  # blocks 1 and 3 replayed whole, read off its plan
    searched = out["fit_scratch_odd_blocks"]  # accepted by --strategies; refused later only by the 1 MiB device
    assert searched["status"] == 2 and "no layout fits 4 GPUs" in searched["stderr"], searched
    assert out["compiled_refusals"]["scratch_odd_blocks"] is None
    # out: the same consumers refuse scratch_first_half, whose row sets none of the three, naming the attribute
    refused = out["tp2_scratch_first_half"]
    assert refused["status"] == 2 and "--tp 2: --strategy scratch_first_half is not simulated by the engine yet (its " \
        "registry row does not set runs_on_fake_ranks" in refused["stderr"], refused
    refused = out["fit_scratch_first_half"]
    assert refused["status"] == 2 and "--strategies 'scratch_first_half': fit searches" in refused["stderr"] \
        and "sets fit_order" in refused["stderr"], refused
    assert "scratch_first_half" not in out["fit_candidate_strategies"]
    assert "its registry row sets no simulated_compiled" in out["compiled_refusals"]["scratch_first_half"]
