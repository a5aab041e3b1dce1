"""The scenario runners, behind one interface: a ``ScenarioRunner`` takes a scenario and the run's ``RunContext``
and returns its ``Result`` (never raises for a scenario that cannot run: ``skipped`` or ``error``, with the reason).

- ``InProcessRunner``: measures the step in this process (``runner.run.run_scenario``).
- ``DistributedRunner``: ``world_size > 1``, ranks under torchrun (``distributed.scenario_run.run_distributed``).
- ``SimulatedRunner``: ``simulate: {enabled: true}``, the step predicted on the meta device
  (``simulate.scenario.run_simulated``).

``runner_for(scenario)`` picks one from the scenario's own settings (``world_size`` first, then ``simulate``);
``SuiteRun`` calls it per scenario unless it was handed a runner of its own (a test's fake measurement).
"""

from __future__ import annotations

from typing import Protocol

from pytest_flashckpt.config.scenario import Scenario
from pytest_flashckpt.core.result import Result
from pytest_flashckpt.runner.context import RunContext
from pytest_flashckpt.runner.outcome import recorded


class ScenarioRunner(Protocol):
    """Measures (or predicts) one scenario in a run's context."""

    def __call__(self, scenario: Scenario, ctx: RunContext) -> Result: ...


class InProcessRunner:
    """The step built, trained and measured in this process: memory, timing, FLOPs, checkpoint passes."""

    def __call__(self, scenario: Scenario, ctx: RunContext) -> Result:
        from pytest_flashckpt.runner.run import run_scenario

        return run_scenario(scenario, ctx)


class DistributedRunner:
    """``scenario.world_size`` ranks per node under torchrun (FSDP2 + DCP), their records gathered in one
    ``Result``; a failed or hung launch is an ``error`` result with torchrun's output tail."""

    def __call__(self, scenario: Scenario, ctx: RunContext) -> Result:
        from pytest_flashckpt.distributed.scenario_run import run_distributed

        return run_distributed(scenario, str(ctx.device), ctx.probe, ctx.workdir)


class SimulatedRunner:
    """The step simulated on the meta device: ``simulated_*`` metrics, never a measured ``peak_bytes``."""

    def __call__(self, scenario: Scenario, ctx: RunContext) -> Result:
        from pytest_flashckpt.simulate.scenario import run_simulated

        result = Result(scenario.suite, scenario.name, "measured", scenario, device=str(ctx.device), probe=ctx.probe)
        return recorded(result, lambda: run_simulated(scenario, result))


def runner_for(scenario: Scenario) -> ScenarioRunner:
    """The runner a scenario asks for: distributed when it has ranks, simulated when it says so, else in process."""
    if scenario.world_size > 1:
        return DistributedRunner()
    if scenario.simulate.enabled:
        return SimulatedRunner()
    return InProcessRunner()


def measure_scenario(scenario: Scenario, ctx: RunContext) -> Result:
    """One scenario through the runner ``runner_for`` picks (what a suite run does, without the suite)."""
    return runner_for(scenario)(scenario, ctx)


__all__ = ["DistributedRunner", "InProcessRunner", "ScenarioRunner", "SimulatedRunner", "measure_scenario", "runner_for"]
