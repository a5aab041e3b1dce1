"""The report's "Will it fit?" section from simulated scenarios run through the runner."""

import re

import pytest
import torch

from pytest_flashckpt.core.claims import LARGE, MEDIUM, PROTOTYPE, SAVING_TOLERANCE
from pytest_flashckpt.config.scenario import ActivationConfig, Scenario, SimulateConfig
from pytest_flashckpt.report.simulation import simulation_section
from pytest_flashckpt.runner.context import RunContext
from pytest_flashckpt.runner.runners import measure_scenario


@pytest.fixture(scope="module")
def results():
    ctx = RunContext(torch.device("cpu"), "cpu")
    out = []
    for strategy, world in (("none", 1), ("full", 1), ("full", 2)):
        scenario = Scenario(
            name=f"tiny-{strategy}-{world}", suite="simulate", model="tiny", dtype="bfloat16", batch_size=2, seq_len=512,
            activation=ActivationConfig(strategy=strategy), simulate=SimulateConfig(enabled=True, world_size=world),
        )
        out.append(measure_scenario(scenario, ctx))
    return out


@pytest.mark.slow
def test_runner_records_simulated_metrics(results):
    assert [r.status for r in results] == ["measured"] * 3
    none, full, _rank = results
    assert "peak_bytes" not in full.metrics and full.device == "meta" and full.kernel == "sdpa-flash"
    assert full.metrics["simulated_memory_saving"] == 1 - full.metrics["simulated_peak_bytes"] / none.metrics["simulated_peak_bytes"]
    assert none.metrics["simulated_block_kept_bytes"] - none.metrics["analytic_block_kept_bytes"] == 24


@pytest.mark.slow
def test_section_has_fits_table_and_article_rows(results):
    text = "\n".join(simulation_section(results, article_card="tiny"))
    for column in ("fits 24 GB", "fits 40 GB", "fits 80 GB", "fits 141 GB", "saving vs none"):
        assert column in text
    saving = results[1].metrics["simulated_memory_saving"]
    for claim in (PROTOTYPE, MEDIUM, LARGE):
        row = next(line for line in text.splitlines() if line.startswith(f"| {claim.title}"))
        expected = "holds (simulated)" if abs(saving - claim.saving) <= SAVING_TOLERANCE else "does not hold (simulated)"
        assert re.search(rf"\| {re.escape(expected)}\s+\|$", row), row


def test_section_without_simulations_says_so():
    assert "No simulated scenario" in "\n".join(simulation_section([]))
