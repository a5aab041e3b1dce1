"""A suite run inside pytest: collection, items and hooks only.

Scenarios become test items; each item runs one scenario through the library's per-scenario API
(``runner.suite.SuiteRun``: ``run`` then ``judge``), and the session's end calls ``SuiteRun.finish`` (results.json,
the report, the step summary). Configuration problems are found before anything runs (every scenario validated,
every model card read), so a run that fails to configure writes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.scenario import Scenario
from pytest_flashckpt.config.run_options import Options
from pytest_flashckpt.result import Result


class ScenarioItem(pytest.Item):
    """One scenario as a test item: passes when measured, skips with the reason, fails on a regression."""

    def __init__(self, *, scenario: Scenario, session_state: "SuiteSession", **kwargs) -> None:
        super().__init__(**kwargs)
        self.scenario = scenario
        self.state = session_state
        self.result: Result | None = None
        for keyword in (scenario.attention, scenario.activation.strategy, scenario.save.strategy, scenario.card):
            self.keywords[keyword] = True

    def runtest(self) -> None:
        self.result = self.state.run(self.scenario)
        if self.result.status == "skipped":
            pytest.skip(self.result.reason or "skipped")
        if self.result.status == "error":
            raise ScenarioError(f"{self.nodeid}: {self.result.reason}\n{''.join(self.result.notes[-1:])}")
        self.state.check(self, self.result)

    def reportinfo(self):
        return self.path, None, f"flashckpt scenario {self.nodeid}"

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, (ConfigError, RegressionFailure, ScenarioError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)


class RegressionFailure(AssertionError):
    """A metric regressed against the stored baseline; the message lists each one."""


class ScenarioError(RuntimeError):
    """The scenario broke while running; the message carries the exception and its traceback."""


class SuiteCollector(pytest.Collector):
    def __init__(self, *, scenarios: list[Scenario], session_state: "SuiteSession", **kwargs) -> None:
        super().__init__(**kwargs)
        self.scenarios = scenarios
        self.state = session_state

    def collect(self):
        return [ScenarioItem.from_parent(self, name=s.name, scenario=s, session_state=self.state) for s in self.scenarios]


class SuiteSession:
    """The pytest face of a ``SuiteRun``: it adds test items, pytest-benchmark and the terminal summary."""

    def __init__(self, config: pytest.Config, options: Options, suite) -> None:
        from pytest_flashckpt.runner.suite import SuiteRun  # imports torch: only when a suite is asked for

        self.config = config
        self.options = options
        self.suite = suite
        self.run_state = SuiteRun(suite, options, root=Path(config.invocation_params.dir))
        self.deselected = 0  # scenarios deselected with -k / -m
        self._bench = None  # benchmark_bridge.BenchmarkBridge when pytest-benchmark is active
        self.outputs = None  # runner.suite.RunOutputs once the session finished

    @property
    def results(self) -> list[Result]:
        return self.run_state.results

    @classmethod
    def start(cls, config: pytest.Config, options: Options) -> "SuiteSession":
        """Load and validate the suite (every scenario and model card); a problem is a usage error."""
        from pytest_flashckpt.config.suites import AUTO_SUITE, default_suite_for
        from pytest_flashckpt.runner.suite import load_checked_suite

        suite_arg = default_suite_for(options.device) if options.suite == AUTO_SUITE else options.suite
        if options.inject and options.save_baseline:
            raise pytest.UsageError(
                "--flashckpt-inject with --flashckpt-save-baseline would store an injected regression as the baseline; drop one"
            )
        if os.path.isdir(suite_arg) or suite_arg.endswith(".py"):
            raise pytest.UsageError(
                f"--flashckpt-suite took {suite_arg!r} as the suite; write --flashckpt-suite=NAME (or put paths first)"
            )
        try:
            suite = load_checked_suite(suite_arg)
        except ConfigError as exc:
            raise pytest.UsageError(f"flashckpt: {exc}") from None
        return cls(config, options, suite)

    # -- collection -----------------------------------------------------------------------------------
    def _collectors(self, session: pytest.Session) -> list[SuiteCollector]:
        by_suite: dict[str, list[Scenario]] = {}
        for scenario in self.suite.scenarios:
            by_suite.setdefault(scenario.suite, []).append(scenario)
        return [
            SuiteCollector.from_parent(session, name=name, nodeid=name, scenarios=scenarios, session_state=self)
            for name, scenarios in by_suite.items()
        ]

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: pytest.Session):
        """With no test paths on the command line, the suite is the whole collection."""
        if self.config.args_source == pytest.Config.ArgsSource.ARGS:
            return None  # explicit paths: collect them normally; suite items are added in modifyitems
        hook = self.config.hook
        session.items = []
        for collector in self._collectors(session):
            items = collector.collect()
            hook.pytest_collectreport(report=pytest.CollectReport(collector.nodeid, "passed", None, items))
            for item in items:
                hook.pytest_itemcollected(item=item)
            session.items.extend(items)
        hook.pytest_collection_modifyitems(session=session, config=self.config, items=session.items)
        hook.pytest_collection_finish(session=session)
        session.testscollected = len(session.items)
        return True

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config, items: list) -> None:
        if self.config.args_source == pytest.Config.ArgsSource.ARGS and not any(isinstance(i, ScenarioItem) for i in items):
            for collector in self._collectors(session):
                items.extend(collector.collect())

    # -- running --------------------------------------------------------------------------------------
    def run(self, scenario: Scenario) -> Result:
        return self.run_state.run(scenario)

    def check(self, item: ScenarioItem, result: Result) -> None:
        """Attach metrics to the test report (JUnit properties), feed pytest-benchmark, and fail on a baseline
        regression (not while ``--flashckpt-save-baseline`` refreshes the baseline: then it is reported only)."""
        for key, value in sorted(result.metrics.items()):
            if isinstance(value, (int, float)):
                item.user_properties.append((key, value))
        if self._bench is None:
            from pytest_flashckpt.benchmark_bridge import BenchmarkBridge

            self._bench = BenchmarkBridge(self.config)
        self._bench.add(item, result)
        from pytest_flashckpt.baselines import BaselineError

        try:
            judgement = self.run_state.judge(result)
        except BaselineError as exc:
            raise RegressionFailure(str(exc)) from None
        for row in judgement.rows:
            item.user_properties.append((f"verdict:{row['metric']}", row["verdict"]))
        if judgement.failure is not None:
            raise RegressionFailure(judgement.failure)

    # -- reporting ------------------------------------------------------------------------------------
    def pytest_deselected(self, items: list) -> None:
        """Scenarios deselected with -k / -m: the run is a subset on purpose, so missing ones do not fail it."""
        count = sum(isinstance(i, ScenarioItem) for i in items)
        if count and not self.options.subset:
            self.deselected += count
            self.run_state.subset = f"{self.deselected} scenario(s) deselected with -k/-m"

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.results:
            self.outputs = self.run_state.finish()
            if self.run_state.missing and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.results:
            return
        from pytest_flashckpt.report import summary_lines

        terminalreporter.section("flashckpt")
        if self.options.inject:
            from pytest_flashckpt.config.injection import Injection

            injection = Injection.parse(self.options.inject)
            if injection is not None:
                terminalreporter.write_line(f"WARNING: {injection.describe()} (--flashckpt-inject): these are not real measurements")
        for line in summary_lines(self.results):
            terminalreporter.write_line(line)
        out = self.outputs
        if out is not None:
            terminalreporter.write_line(f"report: {out.report_path}")
        comparison = out.record.comparison if out is not None else self.run_state.comparison()
        if comparison is not None:
            from pytest_flashckpt.baselines.summary import terminal_lines

            for line in terminal_lines(comparison):
                terminalreporter.write_line(line)
        if self.run_state.missing:
            terminalreporter.write_line(
                f"FAILED: {len(self.run_state.missing)} scenario(s)/metric(s) of the baseline were not measured (missing); "
                "pass --flashckpt-subset if the subset is intended"
            )
        if out is not None and out.baseline_path is not None:
            terminalreporter.write_line(f"baseline saved: {out.baseline_path}")
        if out is not None and out.step_summary is not None:
            terminalreporter.write_line(f"verdicts appended to $GITHUB_STEP_SUMMARY ({out.step_summary})")
        if self._bench is not None and self._bench.note:
            terminalreporter.write_line(f"pytest-benchmark: {self._bench.note}")
