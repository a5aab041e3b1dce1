"""``layout: {cp: N}`` in a simulated suite scenario (issue 32, docs/layouts.md): one of N context-parallel ranks with
torch's ring attention on meta, the record ``flashckpt simulate --cp`` prints, labelled modelled; a request the ring
cannot be simulated for is refused when the suite loads, naming the file, the scenario and the key."""

from __future__ import annotations

import textwrap

import pytest

from pytest_flashckpt.config.axes import LayoutMesh
from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.layout import Layout
from pytest_flashckpt.config.scenario import ActivationConfig, Scenario, SimulateConfig
from pytest_flashckpt.core.result import Result
from pytest_flashckpt.models.cards import load_card
from pytest_flashckpt.report.simulation import _row
from pytest_flashckpt.runner.suite import load_checked_suite
from pytest_flashckpt.simulate.context_parallel import simulate_cp_rank
from pytest_flashckpt.simulate.scenario import run_simulated


@pytest.mark.slow
def test_a_context_parallel_scenario_records_the_ring_rank_labelled_modelled() -> None:
    scenario = Scenario("cp", model="llama-tiny", dtype="bfloat16", batch_size=1, seq_len=256,
                        activation=ActivationConfig(strategy="full"), layout=LayoutMesh(cp=2),
                        simulate=SimulateConfig(enabled=True, world_size=2))
    result = Result("simulate", scenario.name, "measured", scenario)
    run_simulated(scenario, result)
    card, layout = load_card("llama-tiny"), Layout(cp=2)
    full = simulate_cp_rank(card, layout, batch_size=1, seq_len=256, strategy="full")
    none = simulate_cp_rank(card, layout, batch_size=1, seq_len=256, strategy="none")
    m = result.metrics
    assert m["simulated_peak_bytes"] == full["peak_bytes"] and m["simulated_reference_peak_bytes"] == none["peak_bytes"]
    assert sum(m[f"simulated_{category}_bytes"] for category in full["breakdown"]) == full["peak_bytes"]  # by category
    assert result.kernel == "ring attention (modelled)" and "one of 2 context-parallel ranks at 128 tokens" in result.notes[-1]
    assert _row(result)[5] == "2 (cp 2, ring attention, modelled)"


def test_a_sequence_the_ring_cannot_split_is_refused_when_the_suite_loads(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "x.yaml").write_text(textwrap.dedent("""\
        name: x
        scenarios:
          - {name: c, model: llama-tiny, dtype: bfloat16, batch_size: 1, seq_len: 250, measure: [memory],
             simulate: {enabled: true, world_size: 2}, layout: {cp: 2}}
        """), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_checked_suite("suites/x.yaml")
    text = str(info.value)
    assert text.startswith("suites/x.yaml: scenario 'c': seq_len 250: layout cp 2: sequence 250 is not divisible by "
                           "2 x cp = 4 (the load-balanced ring)")
    assert "choose a sequence that is a multiple of 4 or another cp" in text


def test_a_composed_context_parallel_scenario_is_the_engines_rank() -> None:
    """cp with FSDP over dp_shard x cp (or tp, or mixed precision) is simulated by the engine's fake rank (torch's
    ring attention with the CPU flash op on the fake process group), not the modelled meta route."""
    import torch

    from pytest_flashckpt.simulate.fake_ranks import simulate_rank

    card = load_card("llama-tiny", n_layer=1)
    scenario = Scenario("cp", model="llama-tiny", dtype="bfloat16", batch_size=2, seq_len=64,
                        activation=ActivationConfig(strategy="full"), layout=LayoutMesh(cp=2),
                        simulate=SimulateConfig(enabled=True, world_size=4), measure=("memory",))
    result = Result("simulate", scenario.name, "measured", scenario)
    run_simulated(scenario, result)
    expected = simulate_rank(load_card("llama-tiny"), Layout(dp_shard=2, cp=2), batch_size=2, seq_len=64,
                             strategy="full", dtype=torch.bfloat16, foreach=True)
    assert result.metrics["simulated_peak_bytes"] == expected["peak_bytes"]
    assert "torch's ring attention over 2 cp ranks + fully_shard over dp_shard x cp" in result.notes[-1]
    assert _row(result)[5] == "4 (dp_shard 2 x tp 1 x cp 2)"
    assert card.n_layer == 1
