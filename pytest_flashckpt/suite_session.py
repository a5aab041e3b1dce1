"""A suite run inside pytest: scenarios become test items; results become ``results.json`` and the report.

``SuiteSession`` holds the run's state; its methods are the hooks. Configuration problems are found before
anything runs (every scenario validated, every model card read), so a run that fails to configure writes
nothing.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

import pytest

from pytest_flashckpt import __version__
from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.scenario import Scenario
from pytest_flashckpt.options import Options
from pytest_flashckpt.result import Result, RunRecord


class ScenarioItem(pytest.Item):
    """One scenario as a test item: passes when measured, skips with the reason, fails on a regression."""

    def __init__(self, *, scenario: Scenario, session_state: "SuiteSession", **kwargs) -> None:
        super().__init__(**kwargs)
        self.scenario = scenario
        self.state = session_state
        self.result: Result | None = None
        for keyword in (scenario.attention, scenario.activation.strategy, scenario.checkpoint.strategy, scenario.card):
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
    def __init__(self, config: pytest.Config, options: Options, suite) -> None:
        self.config = config
        self.options = options
        self.suite = suite
        self.results: list[Result] = []
        self.started = datetime.now(timezone.utc)
        self.report_dir = Path(config.invocation_params.dir) / options.report
        self._ctx = None
        self._profile: tuple[dict, str] | None = None
        self._gate = None  # baselines.Gate, made at the first check (needs the profile, hence torch)
        self._bench = None  # benchmark_bridge.BenchmarkBridge when pytest-benchmark is active
        self.report_path: Path | None = None
        self.deselected: list[str] = []  # scenario ids deselected by -k / -m: a subset on purpose
        self.missing_failures: list[dict] = []
        self.saved_baseline: Path | None = None
        self.step_summary: Path | None = None

    @classmethod
    def start(cls, config: pytest.Config, options: Options) -> "SuiteSession":
        """Load and validate the suite (every scenario and model card); a problem is a usage error."""
        from pytest_flashckpt.config.suites import load_suite
        from pytest_flashckpt.runner.run import preflight

        suite_arg = options.suite
        if options.inject and options.save_baseline:
            raise pytest.UsageError(
                "--flashckpt-inject with --flashckpt-save-baseline would store an injected regression as the baseline; drop one"
            )
        if os.path.isdir(suite_arg) or suite_arg.endswith(".py"):
            raise pytest.UsageError(
                f"--flashckpt-suite took {suite_arg!r} as the suite; write --flashckpt-suite=NAME (or put paths first)"
            )
        try:
            suite = load_suite(suite_arg)
            for scenario in suite.scenarios:
                preflight(scenario)
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

    def pytest_deselected(self, items: list) -> None:
        self.deselected += [f"{i.scenario.suite}::{i.scenario.name}" for i in items if isinstance(i, ScenarioItem)]

    def subset_reason(self) -> str | None:
        """Why this run measures a subset of its suites on purpose, or None when it should measure them all."""
        if self.options.subset:
            return "--flashckpt-subset"
        if self.deselected:
            return f"{len(self.deselected)} scenario(s) deselected with -k/-m"
        return None

    # -- running --------------------------------------------------------------------------------------
    def _context(self):
        if self._ctx is None:
            from pytest_flashckpt.probes import default_probe_name
            from pytest_flashckpt.runner.run import RunContext, resolve_device

            device = resolve_device(self.options.device)
            probe = default_probe_name(device.type) if self.options.probe == "auto" else self.options.probe
            from pytest_flashckpt.runner.inject import Injection

            workdir = Path(self.options.workdir) if self.options.workdir else None
            self._ctx = RunContext(device=device, probe=probe, workdir=workdir, inject=Injection.parse(self.options.inject))
        return self._ctx

    def run(self, scenario: Scenario) -> Result:
        import dataclasses

        from pytest_flashckpt.runner.run import run_scenario

        if self.options.rounds:
            scenario = dataclasses.replace(scenario, rounds=self.options.rounds)
        if self.options.saves and scenario.checkpoint.strategy != "none":
            scenario = dataclasses.replace(scenario, checkpoint=dataclasses.replace(scenario.checkpoint, saves=self.options.saves))
        result = run_scenario(scenario, self._context())
        self.results.append(result)
        return result

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
        from pytest_flashckpt.baselines import BaselineError, failure_text

        try:
            gate = self.gate()
        except BaselineError as exc:
            raise RegressionFailure(str(exc)) from None
        rows = gate.judge(result)
        for row in rows:
            item.user_properties.append((f"verdict:{row['metric']}", row["verdict"]))
        text = failure_text(rows, gate.lookup.path, gate.thresholds)
        if text is not None and not self.options.save_baseline:
            raise RegressionFailure(text)

    # -- baselines ------------------------------------------------------------------------------------
    def profile(self) -> tuple[dict, str]:
        """This run's hardware/software profile and its id (computed once)."""
        if self._profile is None:
            import torch

            from pytest_flashckpt.models.attention import resolve_backend
            from pytest_flashckpt.profile import current_profile, profile_id

            ctx = self._context()
            profile = current_profile(str(ctx.device), resolve_backend("auto", ctx.device, torch.float32))
            self._profile = (profile, profile_id(profile))
        return self._profile

    def baseline_dir(self) -> Path:
        """``--flashckpt-baseline-dir`` (relative to the invocation folder), default ``./baselines``."""
        return Path(self.config.invocation_params.dir) / self.options.baseline_dir

    def gate(self):
        if self._gate is None:
            from pytest_flashckpt.baselines import Gate, Thresholds

            thresholds = Thresholds(
                timing_tolerance=self.options.timing_tolerance,
                memory_tolerance=self.options.memory_tolerance,
                alpha=self.options.alpha,
                gate_times=self.options.gate_times,
            )
            self._gate = Gate(self.baseline_dir(), self.profile()[1], thresholds, enabled=not self.options.no_compare)
            if self.options.save_baseline and self._gate.status == "compared":
                self._gate.notes.append("--flashckpt-save-baseline: regressions are reported, not failed; the baseline is refreshed")
        return self._gate

    def comparison(self) -> dict | None:
        from pytest_flashckpt.baselines import BaselineError

        try:
            return self.gate().comparison()
        except BaselineError as exc:
            return {"status": "compared", "baseline_path": None, "baseline_profile_id": None, "message": str(exc), "verdicts": []}

    def save_baseline(self, record: RunRecord) -> Path:
        """Write or update this profile's baseline with the scenarios that ran (others in the file untouched)."""
        from pytest_flashckpt.baselines import Baseline, BaselineError, locate

        lookup = locate(self.baseline_dir(), record.profile_id)
        try:
            baseline = Baseline.read(lookup.path) if lookup.exists else Baseline(record.profile_id, record.profile)
        except BaselineError:
            baseline = Baseline(record.profile_id, record.profile)  # unreadable: replaced by this run's
        baseline.profile = record.profile
        baseline.update(record.results, record.commit, record.created)
        baseline.write(lookup.path)
        return lookup.path

    # -- reporting ------------------------------------------------------------------------------------
    def record(self) -> RunRecord:
        from pytest_flashckpt.profile import git_commit

        ctx = self._context()
        profile, pid = self.profile()
        return RunRecord(
            profile=profile,
            profile_id=pid,
            created=self.started.isoformat(timespec="seconds"),
            commit=git_commit(str(self.config.invocation_params.dir)),
            suite=self.suite.name,
            device=str(ctx.device),
            probe=ctx.probe,
            results=self.results,
            tool_version=__version__,
            comparison=self.comparison(),
        )

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.results:
            return
        from pytest_flashckpt.report import write_report

        gate = self._gate
        if gate is not None and not self.options.save_baseline:
            suites = {s.suite for s in self.suite.scenarios}
            self.missing_failures = gate.finish(suites, self.results, self.subset_reason())
            if self.missing_failures and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
        record = self.record()
        if self.options.save_baseline:
            self.saved_baseline = self.save_baseline(record)
        record.write_json(self.report_dir / "results.json")
        self.report_path = write_report(record, self.report_dir)
        if record.comparison is not None:
            from pytest_flashckpt.baselines.summary import append_step_summary

            self.step_summary = append_step_summary(record.comparison)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.results:
            return
        from pytest_flashckpt.report import summary_lines

        terminalreporter.section("flashckpt")
        if self.options.inject:
            from pytest_flashckpt.runner.inject import Injection

            injection = Injection.parse(self.options.inject)
            if injection is not None:
                terminalreporter.write_line(f"WARNING: {injection.describe()} (--flashckpt-inject): these are not real measurements")
        for line in summary_lines(self.results):
            terminalreporter.write_line(line)
        if self.report_path is not None:
            terminalreporter.write_line(f"report: {self.report_path}")
        comparison = self.comparison()
        if comparison is not None:
            from pytest_flashckpt.baselines.summary import terminal_lines

            for line in terminal_lines(comparison):
                terminalreporter.write_line(line)
        if self.missing_failures:
            terminalreporter.write_line(
                f"FAILED: {len(self.missing_failures)} scenario(s)/metric(s) of the baseline were not measured (missing); "
                "pass --flashckpt-subset if the subset is intended"
            )
        if self.saved_baseline is not None:
            terminalreporter.write_line(f"baseline saved: {self.saved_baseline}")
        if self.step_summary is not None:
            terminalreporter.write_line(f"verdicts appended to $GITHUB_STEP_SUMMARY ({self.step_summary})")
        if self._bench is not None and self._bench.note:
            terminalreporter.write_line(f"pytest-benchmark: {self._bench.note}")
