"""The distributed suite's tensor-parallel and HSDP scenarios run end to end (issue 32 item 1): ranks under torchrun with the
scenario's layout, its sharded DCP saves loaded back bit for bit, and each rank's state and optimizer-step peak
equal to the byte to the engine's rank simulated under fake mode (the report's comparison, ``report.distributed``).
One launch per scenario (~10 s at tp 2, ~16 s at 2 x 2 on this 2-core machine), so ``slow``."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_flashckpt.config.suites import load_suite
from pytest_flashckpt.distributed.memory import GLOO_STAGING_FACTOR
from pytest_flashckpt.models.cards import load_card


def _layout_scenarios():
    suite = load_suite("distributed")
    chosen = [s for s in suite.scenarios if (s.layout.tensor_parallel or s.layout.dp_replicate > 1)
              and s.activation.strategy != "none" and not s.compile.enabled
              and s.layout.pp == 1 and s.layout.cp == 1]  # compiled ranks: test_compiled_ranks.py; stages, cp: below
    # fewer rounds and saves than the suite: what is checked here is what a rank holds and loads, not its times
    return [dataclasses.replace(s, rounds=1, save=dataclasses.replace(s.save, saves=2)) for s in chosen]


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("scenario", _layout_scenarios(), ids=lambda s: s.name)
def test_a_layout_scenario_runs_loads_back_bitwise_and_holds_what_the_engine_simulates(scenario, tmp_path) -> None:
    from pytest_flashckpt.distributed.scenario_run import run_distributed
    from pytest_flashckpt.report.distributed import engine_rank

    result = run_distributed(scenario, "cpu", "cpu", tmp_path)
    assert result.status == "measured", (result.reason, result.notes[-1:])
    layout = scenario.parallel_layout
    dp_shard = layout.dp  # the data-parallel ranks (HSDP replicas read their own rows)
    assert f"layout: {layout.describe()}" in result.notes
    assert result.number("roundtrip_differences") == 0
    (peak, start, optimizer), why = engine_rank(result)
    assert why == ""
    assert result.per_rank["state_bytes"] == [start] * scenario.world_size
    assert result.per_rank["optimizer_peak_bytes"] == [optimizer] * scenario.world_size
    # the forward+backward peak: higher by what gloo's thread still holds of finished collectives (docs/layouts.md)
    rows = scenario.batch_size // dp_shard
    activation = rows * scenario.seq_len * load_card(scenario.card).n_embd * 4  # one float32 (rows, seq, width) activation
    bound = GLOO_STAGING_FACTOR * activation + (result.number("largest_allgather_bytes") or 0)
    for measured in result.per_rank["fwd_bwd_peak_bytes"]:
        assert 0 <= measured - peak <= bound, (measured, peak, bound)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("scenario", [s for s in load_suite("distributed").scenarios if s.layout.pp > 1], ids=lambda s: s.name)
def test_a_pipeline_scenario_runs_loads_back_bitwise_and_every_rank_holds_what_the_engine_simulates(scenario, tmp_path) -> None:
    from pytest_flashckpt.distributed.scenario_run import run_distributed
    from pytest_flashckpt.report.distributed import engine_ranks

    scenario = dataclasses.replace(scenario, rounds=1, save=dataclasses.replace(scenario.save, saves=2))
    result = run_distributed(scenario, "cpu", "cpu", tmp_path)
    assert result.status == "measured", (result.reason, result.notes[-1:])
    layout, pipeline = scenario.parallel_layout, scenario.layout.pipeline_schedule()
    assert f"layout: {layout.describe()}, {pipeline.schedule} over {pipeline.microbatches} microbatches" in result.notes
    if not scenario.compile.enabled:  # (compiled stages save nothing: config.axes refuses their checkpoint pass)
        assert result.number("roundtrip_differences") == 0  # the stages' checkpoint loaded back into fresh stages
    simulated, why = engine_ranks(result)
    assert why == "" and len(simulated) == scenario.world_size
    # each rank's state and optimizer peak equal to the byte to its own stages simulated
    assert result.per_rank["state_bytes"] == [start for _, start, _ in simulated]
    assert result.per_rank["optimizer_peak_bytes"] == [optimizer for _, _, optimizer in simulated]
    first, last = result.per_rank["peak_bytes"][0], result.per_rank["peak_bytes"][-1]
    assert first != last  # the first and the last stage hold different blocks
    if layout.dp == 1 and layout.tp == 1 and layout.cp == 1:  # no collective inside a stage: the whole peak to the byte
        assert result.per_rank["peak_bytes"] == [peak for peak, _, _ in simulated]
        return
    # else higher by what gloo's thread still holds of finished collectives (docs/layouts.md), as the tp rows
    activation = scenario.batch_size // layout.dp * scenario.seq_len * load_card(scenario.card).n_embd * 4
    bound = GLOO_STAGING_FACTOR * activation + (result.number("largest_allgather_bytes") or 0)
    for measured, (peak, _, _) in zip(result.per_rank["fwd_bwd_peak_bytes"], simulated):
        assert 0 <= measured - peak <= bound, (measured, peak, bound)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("scenario", [s for s in load_suite("distributed").scenarios if s.layout.cp > 1 and s.layout.pp == 1
                                      and not s.compile.enabled], ids=lambda s: s.name)  # (stages: above; compiled: test_compiled_ranks)
def test_a_context_parallel_scenario_runs_loads_back_bitwise_and_every_rank_holds_what_the_engine_simulates(scenario, tmp_path) -> None:
    """cp ranks (torch's ring attention, FSDP2 over dp_shard x cp, HSDP replicas of it): the sharded saves loaded back bit for bit, and
    every rank's windows against its own simulated rank (the ring's chunks differ per cp rank). The whole
    forward+backward peak within what gloo's thread may still hold of a finished collective (reports/spike-cp-ranks.md
    reads it equal to the byte at the lowest of three repeats; one step here)."""
    from pytest_flashckpt.distributed.scenario_run import run_distributed
    from pytest_flashckpt.report.distributed import engine_ranks

    scenario = dataclasses.replace(scenario, rounds=1, save=dataclasses.replace(scenario.save, saves=2))
    result = run_distributed(scenario, "cpu", "cpu", tmp_path)
    assert result.status == "measured", (result.reason, result.notes[-1:])
    layout = scenario.parallel_layout
    assert f"layout: {layout.describe()}" in result.notes and result.kernel == "sdpa-flash-cpu"
    assert result.number("roundtrip_differences") == 0
    simulated, why = engine_ranks(result)
    assert why == "" and len(simulated) == scenario.world_size
    assert result.per_rank["state_bytes"] == [start for _, start, _ in simulated]
    assert result.per_rank["optimizer_peak_bytes"] == [optimizer for _, _, optimizer in simulated]
    local = scenario.batch_size // layout.dp * scenario.seq_len // layout.cp
    activation = local * load_card(scenario.card).n_embd * 4  # one float32 activation of the rank's tokens
    bound = GLOO_STAGING_FACTOR * activation + (result.number("largest_allgather_bytes") or 0)
    for measured, (peak, _, _) in zip(result.per_rank["fwd_bwd_peak_bytes"], simulated):
        assert 0 <= measured - peak <= bound, (measured, peak, bound)
