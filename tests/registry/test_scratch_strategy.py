"""One registry for every name: a strategy added to a scratch registry reaches the suite, ``flashckpt simulate``,
the FLOP closed form and the report, and one the simulation cannot run is refused there with its reason."""

from __future__ import annotations

from pathlib import Path

from fresh_python import run_together

SCRIPT = Path(__file__).with_name("scratch_strategy.py")


def test_a_scratch_strategy_reaches_every_consumer_of_the_registry(tmp_path):
    out = run_together({"scratch": [SCRIPT, tmp_path]})["scratch"]
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
