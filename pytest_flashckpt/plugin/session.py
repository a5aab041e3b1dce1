"""A suite run inside pytest: collection, items and hooks only.

Scenarios become test items; pytest's own loop runs them (-k, -m, pytest-xdist), and each item runs its scenario
through the library's per-scenario API (``runner.suite.SuiteRun.step``: the scenario's runner, then the baseline
judgement), the one ``flashckpt run``'s loop uses. The session's end calls ``SuiteRun.finish`` (results.json, the
report, the step summary) and prints the end summary both front ends share (``runner.summary.end_summary``).
Configuration problems are found before anything runs (every scenario validated, every model card read), so a run
that fails to configure writes nothing.

It imports torch (through ``runner.suite``), so ``plugin.hooks`` imports it only when a suite is asked for.
Only pytest's public hooks and API: the scenarios join the collection in ``pytest_collection_modifyitems`` through
``Session.genitems`` (with no test paths ``pytest_ignore_collect`` leaves the suite alone in it), lines go through
``TerminalReporter.write_line`` and ``section``. pytest-xdist needs three more: ``pytest_xdist_make_scheduler`` (every
scenario on one worker, so no two time each other's load), ``config.workeroutput`` (a worker hands its results to the
controller in ``pytest_sessionfinish``) and ``pytest_testnodedown`` (the controller takes them); the controller
alone writes results.json, the report and the baseline.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.run_options import Options
from pytest_flashckpt.config.scenario import Scenario
from pytest_flashckpt.config.suites import AUTO_SUITE, default_suite_for
from pytest_flashckpt.core.result import Result
from pytest_flashckpt.plugin.benchmark_bridge import BenchmarkBridge
from pytest_flashckpt.report.terminal import Heartbeat, scenario_line
from pytest_flashckpt.runner.cards import CardShelf
from pytest_flashckpt.runner.preflight import check_run
from pytest_flashckpt.runner.suite import ScenarioOutcome, SuiteRun, interrupts_as_keyboard_interrupt, load_checked_suite
from pytest_flashckpt.runner.summary import end_summary


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
        outcome = self.state.step(self.scenario)
        self.result = outcome.result
        if self.result.status == "skipped":
            pytest.skip(self.result.reason or "skipped")
        if self.result.status == "error":
            raise ScenarioError(f"{self.nodeid}: {self.result.reason}\n{''.join(self.result.notes[-1:])}")
        self.state.check(self, outcome)

    def reportinfo(self):
        return self.path, None, f"flashckpt scenario {self.nodeid}"

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, (ConfigError, RegressionFailure, ScenarioError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)


WORKER_OUTPUT_KEY = "flashckpt_run"  # what a pytest-xdist worker hands the controller (config.workeroutput)


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


def _keep_scenarios_on_one_xdist_worker(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n N``) the scenarios must not run at the same time (each would time the other's
    load): the controller's scheduler (``xdist_scheduling``) sends them all to one worker, which runs them one
    after another while the other tests still spread over the workers. A CI with ``-n auto`` in its ``addopts``
    keeps working; refusing to run (as pytest-benchmark disables itself) would turn the suite off in exactly the
    CI jobs that should gate on it. ``--dist each`` (every test on every worker) cannot be made safe: refused.
    The report's header notes that other tests shared the CPU."""
    if not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") == "each":
        raise pytest.UsageError(
            "flashckpt: --flashckpt-suite cannot run under pytest-xdist's --dist each (every worker would measure "
            "every scenario at the same time); drop -n / --dist each, or use --dist load"
        )


class SuiteSession:
    """The pytest face of a ``SuiteRun``: it adds test items, pytest-benchmark and the terminal summary."""

    def __init__(self, config: pytest.Config, options: Options, suite, cards: CardShelf | None = None) -> None:
        self.config = config
        self.options = options
        self.suite = suite
        self.run_state = SuiteRun(suite, options, root=Path(config.invocation_params.dir), progress=self._on_phase,
                                  cards=cards)
        self.xdist_worker = hasattr(config, "workerinput")  # a pytest-xdist worker: measures, the controller writes
        self._heartbeat = Heartbeat()
        self._running: str | None = None  # the node id of the scenario item running (None: another test)
        self._scenario_ids: set[str] = set()  # node ids of the suite's items (filled at collection)
        # pytest wrote on the terminal's current line since our last line (another test's file name or dots):
        # tracked here because the reporter's column is not public API
        self._line_open = False
        self.deselected = 0  # scenarios deselected with -k / -m
        self._bench = None  # benchmark_bridge.BenchmarkBridge when pytest-benchmark is active
        self.outputs = None  # runner.suite.RunOutputs once the session finished
        # SIGTERM stops the session as Ctrl-C does (pytest: exit status 2, Interrupted); restored at unconfigure
        self._signals = contextlib.ExitStack()
        self._stop = self._signals.enter_context(interrupts_as_keyboard_interrupt()) if not self.xdist_worker else None

    @property
    def xdist_controller(self) -> bool:
        """This is pytest-xdist's controller (``-n N``): it collects and measures nothing, it gathers and writes."""
        return self.config.pluginmanager.has_plugin("dsession")

    @property
    def results(self) -> list[Result]:
        return self.run_state.results

    @classmethod
    def start(cls, config: pytest.Config, options: Options) -> "SuiteSession":
        """Load and validate the suite (every scenario and model card); a problem is a usage error."""
        suite_arg = default_suite_for(options.device) if options.suite == AUTO_SUITE else options.suite
        if options.inject and options.save_baseline:
            raise pytest.UsageError(
                "--flashckpt-inject with --flashckpt-save-baseline would store an injected regression as the baseline; drop one"
            )
        if os.path.isdir(suite_arg):
            raise pytest.UsageError(
                f"flashckpt: --flashckpt-suite: {suite_arg!r} is a directory, not a suite file; name a suite "
                f"(--flashckpt-suite=NAME or a .yaml file; with test paths, write --flashckpt-suite=NAME before them)"
            )
        if suite_arg.endswith(".py"):
            raise pytest.UsageError(
                f"--flashckpt-suite took {suite_arg!r} as the suite; write --flashckpt-suite=NAME (or put paths first)"
            )
        _keep_scenarios_on_one_xdist_worker(config)
        cards = CardShelf()  # the suite's model cards, read once for the preflight and the run
        try:
            suite = load_checked_suite(suite_arg, cards)
        except ConfigError as exc:  # a problem with no file is the option's: an unknown suite name
            raise pytest.UsageError(f"flashckpt: {exc if exc.where else exc.within('--flashckpt-suite')}") from None
        session = cls(config, options, suite, cards)
        if not session.xdist_worker:  # the controller (or the only process) checks; workers trust it
            try:
                check_run(session.run_state)  # outputs, device, probe, baseline file, memory, disk: before any run
            except ConfigError as exc:
                session._signals.close()
                raise pytest.UsageError(f"flashckpt: {exc}") from None
        return session

    # -- collection -----------------------------------------------------------------------------------
    def _collectors(self, session: pytest.Session) -> list[SuiteCollector]:
        by_suite: dict[str, list[Scenario]] = {}
        for scenario in self.suite.scenarios:
            by_suite.setdefault(scenario.suite, []).append(scenario)
        return [
            SuiteCollector.from_parent(session, name=name, nodeid=name, scenarios=scenarios, session_state=self)
            for name, scenarios in by_suite.items()
        ]

    def _paths_given(self) -> bool:
        """Test paths on the command line: they are collected as usual and the suite's items join them."""
        return self.config.args_source == pytest.Config.ArgsSource.ARGS

    def pytest_ignore_collect(self, collection_path: Path, config: pytest.Config) -> bool | None:
        """With no test paths on the command line the suite is the whole collection: nothing under the rootdir or
        ``testpaths`` is collected (or imported). pytest still walks the starting folder, which yields nothing."""
        return None if self._paths_given() else True

    @pytest.hookimpl(tryfirst=True)  # before -k / -m deselect: the scenarios are selectable like any test
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config, items: list) -> None:
        """The suite's items join the collection through pytest's own ``Session.genitems``, which reports each
        collector and item as it does for files (the "collected N items" line, ``--collect-only``). pytest-xdist's
        controller collects nothing and does not call this hook; each worker does, and must list the same items."""
        for collector in self._collectors(session):
            items.extend(session.genitems(collector))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._scenario_ids = {i.nodeid for i in session.items if isinstance(i, ScenarioItem)}

    # -- running --------------------------------------------------------------------------------------
    def step(self, scenario: Scenario) -> ScenarioOutcome:
        self._heartbeat.printed()  # the scenario's start counts as a line: the heartbeat waits from here
        return self.run_state.step(scenario)

    def check(self, item: ScenarioItem, outcome: ScenarioOutcome) -> None:
        """Attach what ran and the metrics to the test report (JUnit properties), feed pytest-benchmark, and fail
        on a baseline regression or an unreadable baseline file (not on a regression while
        ``--flashckpt-save-baseline`` refreshes the baseline: then it is reported only)."""
        result = outcome.result
        for key, value in (("kernel", result.kernel), ("backend", result.backend), ("probe", result.probe),
                           ("device", result.device)):
            if value:
                item.user_properties.append((key, value))
        for key, value in sorted(result.metrics.items()):
            if isinstance(value, (int, float)):
                item.user_properties.append((key, value))
        if self._bench is None:
            self._bench = BenchmarkBridge(self.config)
        self._bench.add(item, result)
        if outcome.baseline_error is not None:
            raise RegressionFailure(outcome.baseline_error)
        for row in outcome.rows:
            item.user_properties.append((f"verdict:{row.metric}", row.verdict))
        if outcome.failure is not None:
            raise RegressionFailure(outcome.failure)

    # -- live progress --------------------------------------------------------------------------------
    def _verbosity(self) -> int:
        return int(self.config.get_verbosity())

    def _write(self, line: str) -> None:
        """A line through pytest's terminal reporter (``write_line``), outside output capturing (as pytest's live
        logging does). Without ``-v`` the scenario lines replace pytest's dots (see ``pytest_report_teststatus``);
        the reporter's current file is kept, so pytest does not repeat the suite's name before every line, and is
        cleared for the one write when the line is empty (``write_line`` then starts no blank line first)."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        current = reporter.currentfspath
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            if self._verbosity() <= 0 and self._running is not None:
                if not self._line_open:
                    reporter.currentfspath = None  # no blank line first: the line starts where the last one ended
                reporter.write_line(line)
                reporter.currentfspath = current
            else:
                reporter.write_line(line)
        self._line_open = False
        self._heartbeat.printed()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logstart(self, nodeid: str, location) -> None:
        """Without ``-v``: the suite's lines stand on their own (pytest writes no file name and no dots for them)."""
        if self.xdist_worker or nodeid not in self._scenario_ids:
            self._running = None
            self._line_open = True  # pytest writes this test's file name or status letter on the current line
            return
        self._running = nodeid
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None or self._verbosity() > 0:
            return
        suite_path = self.config.rootpath / nodeid.split("::")[0]
        if reporter.currentfspath is None:
            if self._verbosity() == 0:
                reporter.write_line("")
                self._line_open = False
            reporter.currentfspath = suite_path
        elif reporter.currentfspath != suite_path:
            self._line_open = True  # another suite or file: pytest starts a line with its name (or its progress)

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report, config):
        """Without ``-v`` a scenario's progress is its line (``pytest_runtest_logreport``), not a dot."""
        if getattr(report, "flashckpt_line", None) is not None and self._verbosity() in (0, -1):
            word = {"passed": "PASSED", "failed": "FAILED", "skipped": "SKIPPED"}[report.outcome]
            return report.outcome, "", word
        return None

    def _on_phase(self, scenario: Scenario, phase: str) -> None:
        """Heartbeat: the phase of a scenario that has been quiet for more than a few seconds."""
        if self.xdist_worker or self._verbosity() < -1 or not self._heartbeat.due():
            return
        self._write(f"  ... {scenario.suite}::{scenario.name}: {phase}")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call):
        """The scenario's one-line summary rides on its call report (so it reaches the pytest-xdist controller)."""
        report = yield
        if isinstance(item, ScenarioItem) and call.when == "call" and item.result is not None:
            verdict = self.run_state.verdict(item.result)
            report.flashckpt_line = scenario_line(item.result, verdict)
            report.flashckpt_compact = scenario_line(item.result, verdict, compact=True)
        return report

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """One line per scenario as it finishes, after pytest's own status: full by default and with ``-v``,
        compact with ``-q``, none with ``-qq``."""
        line = getattr(report, "flashckpt_line", None)
        if line is None or self.xdist_worker:
            return
        verbosity = self._verbosity()
        if verbosity >= 1:  # pytest already wrote the node id and its outcome: the numbers, indented below it
            self._write("    " + line.split(": ", 1)[-1])
        elif verbosity == 0:
            self._write(line)
        elif verbosity == -1:
            self._write(report.flashckpt_compact)

    # -- pytest-xdist: the workers measure, the controller gathers and writes ---------------------------
    @pytest.hookimpl(optionalhook=True, tryfirst=True)  # a pytest-xdist hook: absent without it
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log):
        """Every scenario on one worker, one after another (``xdist_scheduling``, imported here: it imports
        pytest-xdist, an optional dependency, and this hook is only called when pytest-xdist is active)."""
        from pytest_flashckpt.plugin.xdist_scheduling import SuiteScheduling

        ids = frozenset(f"{s.suite}::{s.name}" for s in self.suite.scenarios)
        return SuiteScheduling(config, log, scenario_ids=ids, dist=config.getvalue("dist"))

    @pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: absent without it
    def pytest_testnodedown(self, node, error) -> None:
        """A worker finished: take its results and verdicts (sent in ``pytest_sessionfinish`` below)."""
        payload = getattr(node, "workeroutput", {}).get(WORKER_OUTPUT_KEY)
        if payload:
            self.run_state.absorb(json.loads(payload))

    # -- reporting ------------------------------------------------------------------------------------
    def pytest_deselected(self, items: list) -> None:
        """Scenarios deselected with -k / -m: the run is a subset on purpose, so missing ones do not fail it."""
        count = sum(isinstance(i, ScenarioItem) for i in items)
        if count and not self.options.subset:
            self.deselected += count
            self.run_state.subset = f"{self.deselected} scenario(s) deselected with -k/-m"

    def pytest_keyboard_interrupt(self, excinfo) -> None:
        """Ctrl-C or SIGTERM during the session: the finished scenarios are written as an interrupted run."""
        self.run_state.interrupt(self._stop.how if self._stop is not None else "Ctrl-C")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self._signals.close()

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if session.exitstatus == pytest.ExitCode.INTERRUPTED:  # also pytest.exit() from a test
            self.run_state.interrupt(self._stop.how if self._stop is not None else "Ctrl-C")
        if self.xdist_worker:  # hand everything to the controller, which writes results.json, report, baseline once
            if self.results:
                self.config.workeroutput[WORKER_OUTPUT_KEY] = json.dumps(self.run_state.handoff())
            return
        if self.results or self.run_state.interrupted:  # an interrupted run says so even with nothing finished
            if self.xdist_controller:
                self.run_state.notes.append(
                    f"pytest-xdist ran this session on {self.config.getoption('numprocesses', '?')} worker(s): the "
                    "scenarios ran one after another on one worker, but other tests may have run in parallel on the "
                    "other workers, sharing the CPU with the timings"
                )
            self.outputs = self.run_state.finish()
            if self.run_state.missing and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not (self.results or self.run_state.interrupted) or self.xdist_worker:
            return
        terminalreporter.section("flashckpt")
        lines = end_summary(self.run_state, self.outputs, claims=self._verbosity() >= 0)
        if self._bench is not None and self._bench.note:
            lines.append(f"pytest-benchmark: {self._bench.note}")
        for line in lines:
            terminalreporter.write_line(line)
