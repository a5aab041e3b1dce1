"""The scenario's precision axis: ``pure`` (everything in dtype, the default) or ``mixed`` (float32 master state,
bf16 compute); validated before anything runs, recorded in results.json, measured and simulated alike."""

import pytest
import torch

from pytest_flashckpt.config.scenario import ActivationConfig, Scenario, SimulateConfig, precision_label
from pytest_flashckpt.config.typed import to_plain
from pytest_flashckpt.runner.context import RunContext
from pytest_flashckpt.runner.runners import measure_scenario


def test_default_is_pure_and_keeps_the_dtype_label():
    s = Scenario(name="a")
    assert s.precision == "pure" and s.precision_label == "fp32"
    assert to_plain(s)["precision"] == "pure"  # every results.json row names it
    assert precision_label("bfloat16") == "bf16"
    assert Scenario(name="b", dtype="bfloat16", precision="mixed").precision_label == "mixed bf16/fp32"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_mixed_needs_bf16(dtype):
    with pytest.raises(ValueError, match=f"precision: mixed computes in bfloat16 .* dtype {dtype}"):
        Scenario(name="a", dtype=dtype, precision="mixed")


def test_mixed_with_the_budget_planner_is_refused():
    with pytest.raises(ValueError, match="precision: mixed with activation.strategy budget"):
        Scenario(name="a", dtype="bfloat16", precision="mixed", activation=ActivationConfig(strategy="budget", budget=0.6))


def test_the_reference_keeps_the_precision():
    s = Scenario(name="a", dtype="bfloat16", precision="mixed", activation=ActivationConfig(strategy="full"))
    assert s.reference().precision == "mixed"


def test_a_mixed_scenario_is_measured_in_mixed_precision_and_equals_its_simulation():
    """Through the runner: the model is float32, the step autocasts, and the cpu probe's peak equals the simulated
    peak of the same scenario (simulate: target cpu)."""
    common = dict(model="tiny", dtype="bfloat16", precision="mixed", batch_size=1, seq_len=64, measure=("memory",),
                  attention="sdpa")
    measured = measure_scenario(Scenario(name="m", **common), RunContext(torch.device("cpu"), "cpu"))
    simulated = measure_scenario(Scenario(name="s", simulate=SimulateConfig(enabled=True, kernel="sdpa", target="cpu"), **common),
                             RunContext(torch.device("cpu"), "cpu"))
    assert measured.status == simulated.status == "measured", (measured.reason, simulated.reason)
    assert measured.config.precision == simulated.config.precision == "mixed"
    assert measured.metrics["peak_bytes"] == simulated.metrics["simulated_peak_bytes"]
    assert measured.metrics["state_bytes"] == simulated.metrics["simulated_start_bytes"]
    assert "analytic_peak_bytes" not in measured.metrics  # the analytic model has no mixed precision


@pytest.mark.parametrize("name", ["gpu", "simulate"])
def test_gpu_and_simulate_suites_show_pure_bf16_and_mixed_rows(name):
    from pytest_flashckpt.config.suites import load_suite

    scenarios = load_suite(name).scenarios
    labels = {s.precision_label for s in scenarios}
    assert {"bf16", "mixed bf16/fp32"} <= labels
    mixed = [s for s in scenarios if s.precision == "mixed"]
    assert mixed and all(s.name.endswith("-mixed") for s in mixed)  # the row's name says it too
    strategies = {s.activation.strategy for s in mixed}
    assert {"none", "full", "selective_op"} <= strategies
