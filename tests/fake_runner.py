"""The ``FakeRunner`` of the plugin tests: a ``ScenarioRunner`` with no training step. In this process the
``fake_runner`` fixture (tests/conftest.py) hands it every scenario; a pytester folder's ``conftest.py`` written by
``conftest_text`` does the same in every pytest process of that run (a subprocess, pytest-xdist's workers), for runs
whose checks are about scheduling, gathering or interruption, not about the numbers a training step gives."""

from __future__ import annotations

from pathlib import Path


class FakeRunner:
    """A ``ScenarioRunner`` with no training step, for tests of what a suite run does with results (gate, verdicts,
    report, options, interruption): fixed bytes per scenario (``extra_peak[name]`` added to its peak) and fixed step
    times, one sample per round; a ``flash_attn`` scenario is skipped as on a machine without flash-attn, and an
    ``error`` scenario (its name) breaks. ``calls`` lists the scenarios it was given, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.extra_peak: dict[str, int] = {}

    def __call__(self, scenario, ctx):
        from pytest_flashckpt.core.result import Result

        self.calls.append(scenario.name)
        attention = "sdpa" if scenario.attention == "auto" else scenario.attention
        result = Result(scenario.suite, scenario.name, "measured", scenario, device=str(ctx.device),
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


def pytest_configure(config):
    """Hands a ``FakeRunner`` every scenario of this pytest process (imported by ``conftest_text``'s conftest)."""
    import pytest_flashckpt.runner.suite as suite_module

    runner, before = FakeRunner(), suite_module.runner_for
    suite_module.runner_for = lambda scenario: runner
    config.add_cleanup(lambda: setattr(suite_module, "runner_for", before))


def conftest_text(extra: str = "") -> str:
    """A pytester conftest that imports this module's ``pytest_configure``, then ``extra`` (more hooks)."""
    here = str(Path(__file__).resolve().parent)
    return f"import sys\n\nsys.path.insert(0, {here!r})\nfrom fake_runner import pytest_configure  # noqa: E402,F401\n" + extra
