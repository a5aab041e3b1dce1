"""``layout: {pp: N, schedule, microbatches, stages_per_rank}`` in a simulated suite scenario (issue 32, docs/layouts.md):
the scenario reads the larger of the first and the last pipeline rank's peaks from torch's schedule under fake mode,
the same record ``flashckpt fit`` reads for a pipeline candidate; a layout the card cannot be split into is refused
when the suite loads, naming the file, the scenario and the key. The config checks alone are in
tests/distributed/test_layout_scenarios.py."""

from __future__ import annotations

import textwrap

import pytest
import torch

from pytest_flashckpt.config.axes import LayoutMesh
from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.layout import Layout, PipelineSchedule
from pytest_flashckpt.config.scenario import ActivationConfig, Scenario, SimulateConfig
from pytest_flashckpt.core.result import Result
from pytest_flashckpt.models.cards import load_card
from pytest_flashckpt.runner.suite import load_checked_suite
from pytest_flashckpt.simulate.pipeline import simulate_first_and_last
from pytest_flashckpt.simulate.scenario import run_simulated


def _pipeline_scenario(strategy: str) -> Scenario:
    return Scenario("pp", model="llama-tiny", batch_size=4, seq_len=64, activation=ActivationConfig(strategy=strategy),
                    layout=LayoutMesh(pp=2, schedule="1f1b", microbatches=4),
                    simulate=SimulateConfig(enabled=True, world_size=2))


@pytest.mark.slow
def test_a_pipeline_scenario_records_the_larger_of_the_first_and_last_rank_as_fit_reads_it() -> None:
    scenario = _pipeline_scenario("full")
    result = Result("simulate", scenario.name, "measured", scenario)
    run_simulated(scenario, result)
    kwargs = dict(batch_size=4, seq_len=64, k=2, dtype=torch.float32, precision="pure")
    layout, pipeline = Layout(dp_shard=1, pp=2), PipelineSchedule("1f1b", 4)
    full = simulate_first_and_last(load_card("llama-tiny"), layout, pipeline, strategy="full", **kwargs)
    none = simulate_first_and_last(load_card("llama-tiny"), layout, pipeline, strategy="none", **kwargs)
    m = result.metrics
    assert m["simulated_peak_bytes"] == full["peak_bytes"] == max(full["ranks"].values())
    assert set(full["ranks"]) == {0, 1} and m["world_size"] == 2
    assert m["simulated_reference_peak_bytes"] == none["peak_bytes"]
    assert m["simulated_memory_saving"] == pytest.approx(1 - full["peak_bytes"] / none["peak_bytes"])
    assert 0 < m["simulated_memory_saving"] < 1  # full checkpointing holds less than none on the pipeline ranks too
    assert "1f1b over 4 microbatches" in result.notes[-1] and "rank 0" in result.notes[-1]


def _suite(tmp_path, monkeypatch, layout: str, world: int = 4) -> str:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "suites").mkdir(exist_ok=True)
    (tmp_path / "suites" / "x.yaml").write_text(textwrap.dedent(f"""\
        name: x
        scenarios:
          - {{name: p, model: llama-tiny, batch_size: 4, seq_len: 64, measure: [memory],
              simulate: {{enabled: true, world_size: {world}}}, layout: {layout}}}
        """), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_checked_suite("suites/x.yaml")
    return str(info.value)


def test_more_stages_than_blocks_or_a_split_vocabulary_is_refused_when_the_suite_loads(tmp_path, monkeypatch) -> None:
    stages = _suite(tmp_path, monkeypatch, "{pp: 4}")  # llama-tiny has 3 blocks
    assert stages.startswith("suites/x.yaml: scenario 'p': layout.pp: layout pp 4: 4 pipeline stages (4 ranks x 1 "
                             "per rank) for 3 blocks")
    assert "set layout.pp to 1" in stages
    heads = _suite(tmp_path, monkeypatch, "{pp: 2, tp: 4}", world=8)  # 6 query heads do not split 4 ways
    assert "scenario 'p': layout.tp:" in heads and "n_head 6, not divisible" in heads
    # control: the same card in 2 stages of 2 data-parallel ranks loads
    (tmp_path / "suites" / "x.yaml").write_text("name: x\nscenarios:\n  - {name: ok, model: llama-tiny, batch_size: 4, "
                                                "seq_len: 64, measure: [memory], simulate: {enabled: true, world_size: 4},"
                                                " layout: {pp: 2, microbatches: 2}}\n")
    loaded = load_checked_suite("suites/x.yaml").scenarios[0]
    assert loaded.parallel_layout == Layout(dp_shard=2, pp=2) and loaded.layout.pipeline_schedule().microbatches == 2
