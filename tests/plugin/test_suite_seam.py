"""The seam the plugin and ``flashckpt run`` share: the runner a scenario gets (in process, distributed,
simulated), a fake runner handed to ``SuiteRun``, and ``flashckpt run`` driving the suite loop (its lines, the end
summary, its exit codes) with no training step."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from fake_runner import FakeRunner

from pytest_flashckpt.config.scenario import Scenario, SimulateConfig
from pytest_flashckpt.runner.context import RunContext
from pytest_flashckpt.runner.runners import DistributedRunner, InProcessRunner, SimulatedRunner, runner_for

SUITE = """\
name: seam
defaults: {model: tiny, batch_size: 1, seq_len: 32, rounds: 2, attention: eager, measure: [memory, timing]}
scenarios:
  - name: reference
  - name: full
    activation: {strategy: full}
  - name: gone
    attention: flash_attn
"""


def test_a_scenario_gets_the_runner_its_settings_ask_for() -> None:
    plain = Scenario(name="p", model="tiny")
    simulated = dataclasses.replace(plain, simulate=SimulateConfig(enabled=True))
    assert isinstance(runner_for(plain), InProcessRunner)
    assert isinstance(runner_for(simulated), SimulatedRunner)
    assert isinstance(runner_for(dataclasses.replace(plain, world_size=2)), DistributedRunner)
    assert isinstance(runner_for(dataclasses.replace(simulated, world_size=2, batch_size=2)), DistributedRunner)


def test_run_scenario_measures_in_process_only() -> None:
    from pytest_flashckpt.runner.run import run_scenario

    simulated = Scenario(name="s", model="tiny", simulate=SimulateConfig(enabled=True))
    with pytest.raises(ValueError, match="scenario 's' is simulated.*use runner.runners.measure_scenario"):
        run_scenario(simulated, RunContext(torch.device("cpu"), "cpu"))


def test_a_simulated_scenario_that_breaks_is_an_error_result() -> None:
    from pytest_flashckpt.config.scenario import ActivationConfig

    scenario = Scenario(name="s", model="tiny", simulate=SimulateConfig(enabled=True),
                        activation=ActivationConfig(strategy="selective_op", save_ops=("aten.mm.default",)))
    result = SimulatedRunner()(scenario, RunContext(torch.device("cpu"), "cpu"))
    assert result.status == "error" and "custom activation.save_ops list is not supported" in result.reason
    assert "Traceback" in result.notes[-1]


def test_suite_run_measures_every_scenario_through_the_runner_it_is_handed(tmp_path: Path, fake_runner) -> None:
    from pytest_flashckpt.config.run_options import Options
    from pytest_flashckpt.runner.suite import SuiteRun, load_checked_suite

    (tmp_path / "seam.yaml").write_text(SUITE, encoding="utf-8")
    fake = FakeRunner()  # another FakeRunner than the one the scenarios' own runner_for now returns
    run = SuiteRun(load_checked_suite(str(tmp_path / "seam.yaml")), Options(suite="seam.yaml", device="cpu", report="out"),
                   tmp_path, runner=fake)
    seen = []
    outputs = run.run_all(on_outcome=lambda outcome: seen.append((outcome.result.scenario, outcome.verdict)))
    assert fake.calls == ["reference", "full", "gone"] and fake_runner.calls == []
    assert seen == [("reference", "no baseline"), ("full", "no baseline"), ("gone", "skipped")]
    assert [r.status for r in outputs.record.results] == ["measured", "measured", "skipped"]
    assert not run.failed()


def _cli(*args: str) -> int:
    """`flashckpt run` on seam.yaml in the current folder (each caller chdirs into its tmp_path)."""
    from pytest_flashckpt.cli import main

    return main(["run", "--suite", "seam.yaml", "--report", "out", "--device", "cpu", *args])


@pytest.mark.slow
def test_flashckpt_run_saves_compares_and_fails_a_regression_with_the_shared_summary(tmp_path, monkeypatch, capsys,
                                                                                       fake_runner) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "seam.yaml").write_text(SUITE, encoding="utf-8")
    assert _cli("--save-baseline") == 0
    out = capsys.readouterr().out
    assert "seam::gone: skipped (flash-attn is not installed (fake runner))" in out
    assert "baseline saved: baselines/cpu-" in out
    assert _cli() == 0
    assert "baseline baselines/cpu-" in capsys.readouterr().out
    fake_runner.extra_peak["full"] = 4096
    assert _cli() == 1  # a regression: exit 1, the failure under the scenario's line, the verdict table
    out = capsys.readouterr().out
    assert "seam::full: " in out and "  peak_bytes: baseline " in out and "regressed seam::full peak_bytes" in out
    record = json.loads((tmp_path / "out" / "results.json").read_text(encoding="utf-8"))
    verdicts = {(v["scenario"], v["metric"]): v["verdict"] for v in record["comparison"]["verdicts"]}
    assert verdicts[("seam::full", "peak_bytes")] == "regressed" and verdicts[("seam::reference", "peak_bytes")] == "ok"
    assert fake_runner.calls.count("full") == 3


def test_flashckpt_run_prints_the_injection_warning_and_a_missing_scenario_with_its_own_flags(tmp_path, monkeypatch,
                                                                                              capsys, fake_runner) -> None:
    """The end summary is the plugin's, with options spelled as the command spells them."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "seam.yaml").write_text(SUITE, encoding="utf-8")
    assert _cli("--save-baseline") == 0
    (tmp_path / "seam.yaml").write_text(SUITE.replace("  - name: full\n    activation: {strategy: full}\n", ""), encoding="utf-8")
    capsys.readouterr()
    assert _cli("--inject", "step=0.1") == 1  # the baseline's 'full' was not measured: missing fails it
    out = capsys.readouterr().out
    assert "WARNING: injected regression: step +10% (--inject): these are not real measurements" in out
    assert "FAILED: " in out and "pass --subset if the subset is intended" in out
    assert _cli("--subset") == 0


def test_flashckpt_run_fails_a_broken_scenario(tmp_path, monkeypatch, capsys, fake_runner) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "seam.yaml").write_text(SUITE + "  - name: error\n", encoding="utf-8")
    assert _cli() == 1
    assert "seam::error: error (RuntimeError: the fake runner breaks scenario 'error')" in capsys.readouterr().out
