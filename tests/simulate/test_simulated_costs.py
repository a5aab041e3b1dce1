"""``SimulatedCosts``: the budget planner's costs simulated on ``meta`` equal the costs measured on a real CPU step
to the byte (target cpu), are additive on ``meta`` too (a simulated planned step peaks where the plan predicts,
offload included), leave out or refuse what cannot be simulated with the reason, and plan suite scenarios and
``flashckpt simulate --budget``, with the clear error naming the minimum below it."""

from __future__ import annotations

import random

import pytest
import torch

from pytest_flashckpt.activation.budget import BudgetTooSmall, MeasuredCosts, min_peak
from pytest_flashckpt.activation.options import BY_ROLE, FULL, NONE, OFFLOAD, default_options
from pytest_flashckpt.cli import main
from pytest_flashckpt.config.scenario import ActivationConfig, Scenario, SimulateConfig
from pytest_flashckpt.models import GPTConfig
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.runner.context import RunContext
from pytest_flashckpt.runner.runners import measure_scenario
from pytest_flashckpt.simulate import simulate_step
from pytest_flashckpt.simulate.costs import SimulatedCosts

EXACT_FIELDS = ("kept", "reach", "flops", "pointwise", "before", "measured_peaks")


def micro(n_layer: int = 3) -> GPTConfig:
    return GPTConfig(vocab_size=64, block_size=64, n_layer=n_layer, n_head=2, n_embd=32, dropout=0.0)


@pytest.mark.slow
@pytest.mark.parametrize(("card", "shapes"), [("tiny", ((1, 64), (2, 32))), ("small", ((1, 32),))])
def test_simulated_costs_equal_measured_costs_on_cpu(card, shapes, one_thread):
    """Every option the planner knows on a CPU, every block, every shape a source plans (the second one from
    the same source: no warm-up on meta): the same step, read the same way, on meta."""
    config = load_card(card)
    measured_source = MeasuredCosts(build_model(config, "sdpa", "cpu", torch.float32))
    # the process's one source for the card (``cpu_costs_for``'s, which the CPU budget scenario below plans from at
    # 1 x 64): the same default pointwise weight as the measured source's (no compared field depends on it)
    simulated_source = SimulatedCosts.shared(card, "float32", "sdpa", "cpu")
    assert simulated_source.pointwise_weight == measured_source.pointwise_weight
    for shape in shapes:
        measured, simulated = measured_source.costs(*shape), simulated_source.costs(*shape)
        assert simulated.options == measured.options == default_options("cpu")
        for name in EXACT_FIELDS:
            assert getattr(simulated, name) == getattr(measured, name), (shape, name)
        assert (simulated.source, measured.source) == ("simulated", "measured")
        assert simulated.excluded == {"offload": "target cpu: there is no device memory to offload from"}


@pytest.mark.slow
def test_a_planned_step_simulated_on_meta_peaks_where_the_plan_predicts_offload_included():
    """Additivity on meta, for CUDA's flash kernel in bf16: mixed plans were never simulated as such."""
    config = micro()
    costs = SimulatedCosts(config, "bf16", "flash", "cuda", options=default_options("cuda"), transfer_weight=1.0).costs(2, 32)
    assert OFFLOAD in costs.options and costs.transfer
    offload = costs.option_index(OFFLOAD)
    assert all(row[offload] > 0 and sum(row) == row[offload] for row in costs.transfer)  # only offload moves bytes
    assert all(row[offload] == 0 for row in costs.flops)  # and recomputes nothing
    for strategy in ("none", "full"):  # the uniform plans are simulate_step's strategies, peak for peak
        assert costs.measured_peaks[strategy] == simulate_step(config, "bf16", 2, 32, "flash", strategy, target="cuda").peak_bytes
    from pytest_flashckpt.activation.wrapper import BlockForward
    from pytest_flashckpt.models.anatomy import get_anatomy, role_hooks
    from pytest_flashckpt.simulate.costs import SimulatedOffload
    from pytest_flashckpt.simulate.step import _measured_step
    from pytest_flashckpt.simulate.workload import simulated_model, simulated_trainer

    rng = random.Random(0)
    plans = [[offload] * costs.n_blocks] + [[rng.randrange(len(costs.options)) for _ in range(costs.n_blocks)] for _ in range(5)]
    model = simulated_model(config, "bfloat16", "flash", "cuda")
    counter = [0] * costs.n_blocks
    forwards = []
    for i, block in enumerate(model.blocks):
        forwards.append(BlockForward(block.forward, NONE, offload_context=lambda i=i: SimulatedOffload(counter, i)))
        block.forward = forwards[-1]
        role_hooks(block, get_anatomy(model))  # by-role options read the projection's role from these
    trainer = simulated_trainer(model, 2, 32, "cuda")
    trainer.train_step()  # AdamW state exists from here on; a step on meta leaves nothing else behind (no data, no
    # allocator), so each plan's measured step below starts from the state a fresh model's warm-up step would leave
    for plan in plans:
        for forward, o in zip(forwards, plan):
            forward.option = costs.options[o]
        probe, _host = _measured_step(trainer, count_host=False)
        assert probe.start_bytes == probe.live_bytes  # the plan's step freed all it made: the next starts clean
        assert probe.peak_bytes == costs.predict_peak(plan), [costs.options[o].name for o in plan]


@pytest.mark.slow
@pytest.mark.parametrize("budget", ["min", "min + 40%", "min + 100%"])
def test_simulate_step_with_a_budget_simulates_the_plan_and_its_peak_is_the_predicted_one(budget):
    sim = simulate_step(micro(), "bf16", 2, 32, "flash", "budget", target="cuda", budget=budget)
    plan = sim.plan
    assert sim.peak_bytes == plan["predicted_peak_bytes"] <= plan["budget_bytes"]
    assert plan["min_peak_bytes"] <= plan["budget_bytes"] <= plan["none_peak_bytes"]
    assert len(plan["blocks"]) == 3 and plan["plan_s"] > 0
    assert "offload" in plan["excluded"] and plan["notes"]


@pytest.mark.slow
def test_offload_is_left_out_with_its_reason_or_refused_when_unpriced():
    costs = SimulatedCosts.shared(micro(), "bf16", "flash", "cuda").costs(2, 32)  # the budget tests' source
    assert OFFLOAD not in costs.options and "transfer_weight" in costs.excluded["offload"]
    assert costs.options == (NONE, *BY_ROLE, FULL)
    with pytest.raises(ValueError, match="'offload' needs transfer_weight"):
        SimulatedCosts(micro(2), "bf16", "flash", "cuda", options=(NONE, OFFLOAD))
    with pytest.raises(ValueError, match="on target 'cpu' there is no device memory to free"):
        SimulatedCosts(micro(2), "float32", "sdpa", "cpu", options=(NONE, OFFLOAD), transfer_weight=1.0)
    with pytest.raises(ValueError, match="world_size 2 is not simulated for budget plans"):
        SimulatedCosts(micro(2), "bf16", "flash", "cuda", world_size=2)


def test_a_budget_below_the_minimum_names_the_minimum():
    costs = SimulatedCosts.shared(micro(), "bf16", "flash", "cuda").costs(2, 32)
    minimum = min_peak(costs).predicted_peak
    with pytest.raises(BudgetTooSmall, match="below the smallest achievable peak") as info:
        simulate_step(micro(), "bf16", 2, 32, "flash", "budget", target="cuda", budget=minimum - 1)
    assert info.value.minimum == minimum


def _scenario(budget: str) -> Scenario:
    return Scenario(
        name=f"tiny-budget-{budget}", suite="simulate", model="tiny", dtype="bfloat16", batch_size=2, seq_len=128,
        activation=ActivationConfig(strategy="budget", budget=budget), simulate=SimulateConfig(enabled=True),
    )


@pytest.mark.slow
def test_a_simulated_budget_scenario_records_the_plan_its_peak_and_the_planning_time():
    ctx = RunContext(torch.device("cpu"), "cpu")
    result = measure_scenario(_scenario("min + 50%"), ctx)
    assert result.status == "measured", result.reason
    m = result.metrics
    assert m["budget_predicted_peak_bytes"] == m["simulated_peak_bytes"] <= m["budget_bytes"]
    assert m["budget_min_peak_bytes"] <= m["budget_bytes"] <= m["budget_none_peak_bytes"]
    assert m["budget_plan_seconds"] > 0 and m["budget_plan"].startswith("b2xs128: ")
    assert any("left out" in note for note in result.notes)
    too_small = measure_scenario(_scenario("1 MiB"), ctx)
    assert too_small.status == "error"
    assert "activation.budget: 1.0 MiB" in too_small.reason and "raise activation.budget to at least" in too_small.reason


@pytest.mark.slow
def test_cli_plans_a_budget_and_names_the_minimum_below_it(capsys):
    assert main(["simulate", "--model", "tiny", "--seq", "128", "--batch", "2", "--budget", "min + 20%"]) == 0
    out = capsys.readouterr().out
    assert "strategy budget" in out and "budget plan (" in out and "option offload left out" in out
    assert main(["simulate", "--model", "tiny", "--seq", "128", "--batch", "2", "--budget", "1 MiB"]) == 2
    err = capsys.readouterr().err
    assert "--budget: 1.0 MiB" in err and "below the smallest achievable peak" in err and "raise --budget to at least" in err
    assert main(["simulate", "--model", "tiny", "--strategy", "budget"]) == 2
    assert "--strategy budget needs --budget" in capsys.readouterr().err


def test_the_suite_scenario_plans_gpt3_2_7b_and_passes_preflight():
    from pytest_flashckpt.config.suites import load_suite
    from pytest_flashckpt.config.preflight import preflight

    suite = load_suite("simulate")
    scenario = next(s for s in suite.scenarios if s.activation.strategy == "budget")
    preflight(scenario)
    assert scenario.card == "gpt3-2.7b" and scenario.simulate.enabled and scenario.activation.budget == "40 GiB"


@pytest.mark.slow
def test_gpt3_2_7b_budget_scenario_fits_its_budget():
    ctx = RunContext(torch.device("cpu"), "cpu")
    from pytest_flashckpt.config.suites import load_suite

    scenario = next(s for s in load_suite("simulate").scenarios if s.activation.strategy == "budget")
    result = measure_scenario(scenario, ctx)
    assert result.status == "measured", result.reason
    m = result.metrics
    assert m["budget_predicted_peak_bytes"] == m["simulated_peak_bytes"] <= m["budget_bytes"] == 40 * 2**30


@pytest.mark.slow
def test_a_gpu_run_plans_from_simulated_costs_with_the_fixed_pointwise_weight_and_a_timed_transfer(monkeypatch):
    """The runner's source for ``budget`` on CUDA (``cuda_costs_for``), on a meta stand-in for the GPU model: the
    card, dtype and kernel are the model's, the pointwise weight is the fixed model's (no timing), offload is
    planned (priced by the transfer weight timed on the GPU); without a source, a non-CPU model is refused with the
    way to get one."""
    from pytest_flashckpt.activation import StrategyUnavailable, apply_ac
    from pytest_flashckpt.activation.budget import costs as budget_costs
    from pytest_flashckpt.simulate import costs as simulated_costs

    timed = []
    monkeypatch.setattr(simulated_costs, "measure_transfer_weight", lambda device, dtype: timed.append(("transfer", device.type)) or 0.5)
    monkeypatch.setattr(simulated_costs, "_TRANSFER_WEIGHTS", {})
    model = build_model(micro(), "sdpa", "meta", torch.bfloat16)
    source = simulated_costs.cuda_costs_for(model)
    assert timed == [("transfer", "meta")]
    assert simulated_costs.cuda_costs_for(build_model(micro(), "sdpa", "meta", torch.bfloat16)) is source  # timed once
    assert timed == [("transfer", "meta")]
    pointwise = budget_costs.pointwise_weight_for("cuda", torch.bfloat16)
    assert (source.kernel, source.target, source.dtype, source.pointwise_weight, source.transfer_weight) == ("sdpa", "cuda", "bfloat16", pointwise, 0.5)
    costs = source.costs(2, 32)
    assert OFFLOAD in costs.options and not costs.excluded and costs.transfer_weight == 0.5
    offload = costs.option_index(OFFLOAD)
    assert costs.transfer[0][offload] > 0 and costs.flops[0][offload] == 0
    assert costs.cost(0, offload) == pointwise * costs.pointwise[0][offload] + 0.5 * costs.transfer[0][offload]
    with pytest.raises(StrategyUnavailable, match="SimulatedCosts"):
        apply_ac(model, ActivationConfig(strategy="budget", budget="min"), shape=(2, 32))
    applied = apply_ac(build_model(micro(), "sdpa", "meta", torch.bfloat16), ActivationConfig(strategy="budget", budget="min"),
                       shape=(2, 32), source=source)
    assert applied.plans[2, 32].plan.predicted_peak == min_peak(costs).predicted_peak


def test_the_report_lists_a_simulated_budget_plan():
    from pytest_flashckpt.report.simulation import simulation_section

    result = measure_scenario(_scenario("min + 50%"), RunContext(torch.device("cpu"), "cpu"))
    text = "\n".join(simulation_section([result]))
    row = next(line for line in text.splitlines() if line.startswith("| `") and "b2xs128:" in line)
    assert "Budget plans from simulated costs" in text and "TFLOP" in row


def test_a_simulated_budget_scenario_on_several_ranks_is_refused_before_it_runs():
    from pytest_flashckpt.config.errors import ConfigError
    from pytest_flashckpt.config.preflight import preflight

    scenario = Scenario(
        name="tiny-budget-fsdp2", suite="simulate", model="tiny", dtype="bfloat16", batch_size=2, seq_len=128,
        activation=ActivationConfig(strategy="budget", budget="min"), simulate=SimulateConfig(enabled=True, world_size=2),
    )
    with pytest.raises(ConfigError, match="simulate.world_size.*one device only"):
        preflight(scenario)


def test_cpu_budget_runs_plan_from_simulated_costs_where_they_are_tested_equal():
    """The runner's CPU source: simulated (byte-equal, fast) for sdpa without dropout; measured (None) otherwise."""
    from pytest_flashckpt.simulate.costs import cpu_costs_for

    source = cpu_costs_for(build_model(micro(), "sdpa", "cpu", torch.float32))
    assert isinstance(source, SimulatedCosts) and (source.target, source.kernel, source.dtype) == ("cpu", "sdpa", "float32")
    dropout = GPTConfig(vocab_size=64, block_size=64, n_layer=2, n_head=2, n_embd=32, dropout=0.1)
    assert cpu_costs_for(build_model(dropout, "sdpa", "cpu", torch.float32)) is None
    assert cpu_costs_for(build_model(micro(), "eager", "cpu", torch.float32)) is None


@pytest.mark.slow
def test_a_cpu_budget_scenario_peaks_where_its_simulated_plan_predicts():
    """End to end through the runner: the plan comes from simulated costs, the exact probe measures the step."""
    scenario = Scenario(name="b", model="tiny", attention="sdpa", batch_size=1, seq_len=64, measure=("memory",),
                        activation=ActivationConfig(strategy="budget", budget="min + 50%"), rounds=1)
    result = measure_scenario(scenario, RunContext(device=torch.device("cpu"), probe="cpu"))
    assert result.status == "measured", result.reason
    plan_note = next(n for n in result.notes if n.startswith("activation: "))
    predicted_mib = plan_note.split("predicted peak ")[1].split(" MiB")[0]  # the note rounds; tests above are byte-exact
    assert f"{result.metrics['peak_bytes'] / 2**20:,.1f}" == predicted_mib, plan_note
