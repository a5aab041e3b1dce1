"""Shared test helpers. Hypothesis profiles: ``ci`` (default, fast) and ``deep``, chosen by the environment
variable FLASHCKPT_HYPOTHESIS_PROFILE."""

import os
import sys

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("FLASHCKPT_HYPOTHESIS_PROFILE", "ci"))

pytest_plugins = ["pytester"]


@pytest.fixture(scope="session", autouse=True)
def inprocess_pytest_keeps_imported_libraries(tmp_path_factory):
    """``pytester.runpytest_inprocess`` (and each pytester test's end) restores ``sys.modules`` to a snapshot, so
    modules a run imported are imported again by the next: right for the runs' own test files, fatal for torch,
    whose lazily imported parts register operator libraries once per process (``torch._inductor.test_operators``:
    "Only a single TORCH_LIBRARY can be used to register the namespace"). Here the snapshot keeps every module but
    those loaded from the runs' temporary folders (their test files and conftests)."""
    from _pytest import pytester

    basetemp = str(tmp_path_factory.getbasetemp())

    def from_a_run(name: str) -> bool:
        return str(getattr(sys.modules.get(name), "__file__", None) or "").startswith(basetemp)

    class KeepingLibraries(pytester.SysModulesSnapshot):
        def __init__(self, preserve=None) -> None:
            super().__init__(preserve=lambda name: not from_a_run(name) or (preserve is not None and preserve(name)))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pytester, "SysModulesSnapshot", KeepingLibraries)
        yield


@pytest.fixture
def one_thread():
    """Tiny models: one intra-op thread is faster and steadier on a shared 2-core machine (modules that want it say
    ``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class FakeRunner:
    """A ``ScenarioRunner`` with no training step, for tests of what a suite run does with results (gate, verdicts,
    report, options, interruption): fixed bytes per scenario (``extra_peak[name]`` added to its peak) and fixed step
    times, one sample per round; a ``flash_attn`` scenario is skipped as on a machine without flash-attn, and an
    ``error`` scenario (its name) breaks. ``calls`` lists the scenarios it was given, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.extra_peak: dict[str, int] = {}

    def __call__(self, scenario, ctx):
        from pytest_flashckpt.config.typed import to_plain
        from pytest_flashckpt.core.result import Result

        self.calls.append(scenario.name)
        attention = "sdpa" if scenario.attention == "auto" else scenario.attention
        result = Result(scenario.suite, scenario.name, "measured", to_plain(scenario), device=str(ctx.device),
                        backend=attention, kernel=attention, probe=ctx.probe)
        if attention == "flash_attn":
            result.status, result.reason = "skipped", "flash-attn is not installed (fake runner)"
            return result
        if scenario.name == "error":
            result.status, result.reason = "error", "RuntimeError: the fake runner breaks scenario 'error'"
            result.notes.append("Traceback (fake)")
            return result
        peak = 70 * 2**20 + self.extra_peak.get(scenario.name, 0)
        result.metrics = {"peak_bytes": peak, "state_bytes": 50 * 2**20, "step_time_s": 0.01}
        result.samples = {"step_time_s": [0.01] * max(scenario.rounds, 1)}
        if scenario.activation.strategy != "none":
            reference = 70 * 2**20
            result.metrics.update(reference_peak_bytes=reference, memory_saving=1 - peak / reference, overhead=1.25,
                                  reference_step_time_s=0.008)
            result.samples["overhead"] = [1.25] * max(scenario.rounds, 1)
        return result


@pytest.fixture
def fake_runner(monkeypatch) -> FakeRunner:
    """Every suite run of this test (``SuiteRun`` in this process, ``pytester.runpytest_inprocess`` included)
    measures through a ``FakeRunner`` instead of the runner the scenario asks for."""
    import pytest_flashckpt.plugin.session  # noqa: F401  (imported out here: kept by pytester's sys.modules snapshot)
    import pytest_flashckpt.runner.suite as suite_module

    runner = FakeRunner()
    monkeypatch.setattr(suite_module, "runner_for", lambda scenario: runner)
    return runner
