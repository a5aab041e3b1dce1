"""A suite run without pytest: ``run_suite(suite, options) -> RunRecord``, and ``SuiteRun``, its per-scenario API.

``SuiteRun`` is what every front end drives: the pytest plugin (one test item per scenario: ``run`` then
``judge``), ``flashckpt run`` (``run_suite``: every scenario, then ``finish``), and later a distributed rank runner
or a simulation runner, which plug in their own ``measure`` (a ``ScenarioRunner``: scenario + context -> Result).
The run's context (device, probe, profile) is resolved once, in ``runner.context``; baselines are read, judged
and saved by ``baselines``; ``finish`` writes ``results.json``, the markdown report and the CI step summary.
See docs/architecture.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator, Protocol

from pytest_flashckpt import __version__
from pytest_flashckpt.core.comparison import Comparison, RegressionVerdict
from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.preflight import preflight
from pytest_flashckpt.config.run_options import Options
from pytest_flashckpt.config.scenario import Scenario
from pytest_flashckpt.config.suites import Suite, load_suite
from pytest_flashckpt.core.result import Result, RunRecord
from pytest_flashckpt.runner.context import RunContext


Progress = Callable[[Scenario, str], None]  # (scenario, phase: "memory pass", "timing round 3/5", "save 2/6")


class ScenarioRunner(Protocol):
    """Measures one scenario in a run's context; ``runner.run.run_scenario`` is the in-process one."""

    def __call__(self, scenario: Scenario, ctx: RunContext) -> Result: ...


@dataclass(frozen=True)
class Judgement:
    """One scenario's regression verdict rows, and the failure text when a metric regressed (None otherwise;
    also None while ``save_baseline`` refreshes the baseline: then regressions are reported, not failed)."""

    rows: list[RegressionVerdict]
    failure: str | None


@dataclass
class RunOutputs:
    record: RunRecord
    results_path: Path
    report_path: Path
    baseline_path: Path | None = None
    step_summary: Path | None = None


def load_checked_suite(name_or_path: str) -> Suite:
    """Load a suite and preflight every scenario (model cards read, sequences fit): ConfigError before anything runs."""
    suite = load_suite(name_or_path)
    for scenario in suite.scenarios:
        preflight(scenario, suite.origin(scenario))
    return suite


class SuiteRun:
    """The state of one suite run; ``root`` is the folder relative paths (report, baselines) are resolved from."""

    def __init__(self, suite: Suite, options: Options, root: Path | None = None, measure: ScenarioRunner | None = None,
                 progress: Progress | None = None) -> None:
        self.suite = suite
        self.options = options
        self.root = Path(root) if root is not None else Path.cwd()
        self.progress = progress  # told (scenario, phase) as a scenario goes: front ends print a heartbeat
        self.results: list[Result] = []
        self.verdicts: dict[str, str] = {}  # scenario id -> one word (report.terminal.scenario_verdict)
        self.notes: list[str] = []  # conditions of the run the report's header states (e.g. parallel xdist workers)
        self.started = datetime.now(timezone.utc)
        self._measure = measure
        self._ctx: RunContext | None = None
        self._gate = None  # baselines.Gate, made at the first judgement (needs the profile, hence torch)
        self.subset: str | None = "--flashckpt-subset" if options.subset else None  # why a subset is intended
        self.missing: list[RegressionVerdict] = []  # missing rows that fail the run (set by finish)
        self.interrupted = False  # stopped by Ctrl-C / SIGTERM (``interrupt``): finish writes a partial record

    # -- context ------------------------------------------------------------------------------------
    @property
    def context(self) -> RunContext:
        if self._ctx is None:
            o = self.options
            self._ctx = RunContext.resolve(o.device, o.probe, o.workdir or None, o.inject)
            self._ctx.dtypes = tuple(s.dtype for s in self.suite.scenarios)
        return self._ctx

    @property
    def report_dir(self) -> Path:
        return self.root / self.options.report

    @property
    def baseline_dir(self) -> Path:
        return self.root / self.options.baseline_dir

    # -- per scenario -------------------------------------------------------------------------------
    def run(self, scenario: Scenario) -> Result:
        """Measure one scenario (``--rounds`` and ``--saves`` applied) and keep its result for the record."""
        if self.options.rounds:
            scenario = dataclasses.replace(scenario, rounds=self.options.rounds)
        if self.options.saves and scenario.save.strategy != "none":
            scenario = dataclasses.replace(scenario, save=dataclasses.replace(scenario.save, saves=self.options.saves))
        measure = self._measure
        if measure is None:
            from pytest_flashckpt.runner.run import run_scenario

            measure = run_scenario
        ctx = self.context
        if self.progress is not None:
            progress = self.progress
            ctx.on_phase = lambda phase: progress(scenario, phase)
        try:
            result = measure(scenario, ctx)
        finally:
            ctx.on_phase = None
        self.results.append(result)
        return result

    def gate(self):
        """The baseline gate of this run (BaselineError when this profile's baseline file is unreadable)."""
        if self._gate is None:
            from pytest_flashckpt.baselines import Gate, Thresholds

            o = self.options
            thresholds = Thresholds(o.timing_tolerance, o.memory_tolerance, o.alpha, o.gate_times)
            self._gate = Gate(self.baseline_dir, self.context.profile()[1], thresholds, enabled=not o.no_compare,
                              display_root=self.root)
            if o.save_baseline and self._gate.status == "compared":
                self._gate.note("--flashckpt-save-baseline: regressions are reported, not failed; the baseline is refreshed")
        return self._gate

    def judge(self, result: Result) -> Judgement:
        """Regression verdicts of one result against the stored baseline (raises BaselineError for a bad file)."""
        from pytest_flashckpt.baselines import failure_text

        from pytest_flashckpt.report.terminal import scenario_verdict

        gate = self.gate()
        rows = gate.judge(result)
        self.verdicts[result.id] = scenario_verdict(result, rows, gate.status)
        text = failure_text(rows, gate.shown_path, gate.thresholds)
        return Judgement(rows, None if self.options.save_baseline else text)

    def verdict(self, result: Result) -> str:
        """One word for a finished scenario (its worst verdict, or skipped / error / no baseline ...)."""
        from pytest_flashckpt.report.terminal import scenario_verdict

        return self.verdicts.get(result.id) or scenario_verdict(result, None, self._gate.status if self._gate else None)

    def shown(self, path: Path | str) -> str:
        """``path`` relative to the run's root (the invocation folder) when below it."""
        from pytest_flashckpt.core.files import shown_path

        return shown_path(path, self.root)

    # -- a run measured in other processes (pytest-xdist workers) -------------------------------------------
    def handoff(self) -> dict:
        """What this process measured and judged, as JSON-able data for ``absorb`` in the process that writes."""
        gate = self._gate
        return {
            "results": [r.to_dict() for r in self.results],
            "verdict_words": dict(self.verdicts),
            "verdicts": [v.to_dict() for v in gate.verdicts] if gate is not None else [],
            "gate_notes": [n.to_dict() for n in gate.notes] if gate is not None else [],
            "not_in_baseline": list(gate.not_in_baseline) if gate is not None else [],
        }

    def absorb(self, handoff: dict) -> None:
        """Take another process's ``handoff`` as if this run had measured and judged it (results kept in the
        suite's order)."""
        from pytest_flashckpt.core.comparison import RegressionVerdict, VerdictNote

        self.results.extend(Result.from_dict(r) for r in handoff.get("results", []))
        order = {f"{s.suite}::{s.name}": i for i, s in enumerate(self.suite.scenarios)}
        self.results.sort(key=lambda r: order.get(r.id, len(order)))
        self.verdicts.update(handoff.get("verdict_words", {}))
        if handoff.get("verdicts") or handoff.get("gate_notes") or handoff.get("not_in_baseline"):
            from pytest_flashckpt.baselines import BaselineError

            try:
                gate = self.gate()
            except BaselineError:  # an unreadable baseline file: comparison() reports it
                return
            gate.verdicts.extend(RegressionVerdict.from_dict(v) for v in handoff.get("verdicts", []))
            notes = [VerdictNote.from_dict(n) for n in handoff.get("gate_notes", [])]
            gate.notes.extend(n for n in notes if n not in gate.notes)
            gate.not_in_baseline.extend(handoff.get("not_in_baseline", []))

    # -- an interrupted run -------------------------------------------------------------------------
    def interrupt(self, how: str = "Ctrl-C") -> None:
        """The run was stopped (``how``: Ctrl-C, SIGTERM) while a scenario ran: the finished scenarios are kept,
        ``finish`` marks the record interrupted, and no baseline is updated from a partial run."""
        if self.interrupted:
            return
        self.interrupted = True
        done = len(self.results)
        self.notes.append(
            f"interrupted ({how}) after {done} of {len(self.suite.scenarios)} scenario(s): a partial run; the scenario "
            "running was dropped and the baseline was not updated"
        )

    # -- the whole run ------------------------------------------------------------------------------
    def comparison(self) -> Comparison:
        from pytest_flashckpt.baselines import BaselineError
        from pytest_flashckpt.baselines.gate import unreadable_baseline

        try:
            return self.gate().comparison()
        except BaselineError as exc:
            return unreadable_baseline(str(exc))

    def record(self) -> RunRecord:
        from pytest_flashckpt.runner.profile import git_commit

        ctx = self.context
        profile, pid = ctx.profile()
        return RunRecord(
            profile=profile,
            profile_id=pid,
            created=self.started.isoformat(timespec="seconds"),
            commit=git_commit(str(self.root)),
            suite=self.suite.name,
            device=str(ctx.device),
            probe=ctx.probe,
            results=self.results,
            tool_version=__version__,
            comparison=self.comparison(),
            notes=list(self.notes),
            interrupted=self.interrupted,
        )

    def finish(self) -> RunOutputs:
        """Save the baseline (when asked), write ``results.json``, the report, and the CI step summary."""
        from pytest_flashckpt.baselines import save_run
        from pytest_flashckpt.config.run_options import DEFAULT_REPORT_DIR
        from pytest_flashckpt.report.folder import make_report_folder, write_run_folder
        from pytest_flashckpt.report.regression import append_step_summary

        if self._gate is not None and not self.options.save_baseline and not self.interrupted:
            self.missing = self._gate.finish({s.suite for s in self.suite.scenarios}, self.results, self.subset)
        record = self.record()
        make_report_folder(self.report_dir, self_ignoring=self.options.report == DEFAULT_REPORT_DIR)
        save = self.options.save_baseline and not self.interrupted  # a partial run never becomes the baseline
        baseline = save_run(self.baseline_dir, record) if save else None  # locked merge
        results_path, report_path = write_run_folder(record, self.report_dir)  # results + report + plots, locked
        summary = append_step_summary(record.comparison) if record.comparison is not None else None
        return RunOutputs(record, results_path, report_path, baseline, summary)

    def failed(self) -> bool:
        """A scenario broke, a metric regressed, or a baseline scenario/metric is missing without an intended
        subset (not while the baseline is being refreshed)."""
        if self.interrupted or any(r.status == "error" for r in self.results):
            return True
        return not self.options.save_baseline and bool(self.comparison().regressed or self.missing)


def run_suite(suite: Suite | str, options: Options, root: Path | None = None, measure: ScenarioRunner | None = None) -> RunRecord:
    """Run every scenario of ``suite`` (a loaded Suite, a shipped name or a YAML path), judge each against the
    baseline, write ``results.json`` and the report under ``options.report``; returns the run's record."""
    return run_suite_outputs(suite, options, root, measure).record


def run_suite_outputs(suite: Suite | str, options: Options, root: Path | None = None, measure: ScenarioRunner | None = None) -> RunOutputs:
    """``run_suite``'s outputs; a Ctrl-C or SIGTERM during a scenario stops the run, and the finished scenarios
    are written as an interrupted record (``RunOutputs.record.interrupted``)."""
    if isinstance(suite, str):
        suite = load_checked_suite(suite)
    from pytest_flashckpt.baselines import BaselineError

    run = SuiteRun(suite, options, root, measure)
    from pytest_flashckpt.runner.preflight import check_run, command_flag

    check_run(run, command_flag)  # ConfigError before anything runs
    with interrupts_as_keyboard_interrupt() as stopped:
        try:
            for scenario in suite.scenarios:
                result = run.run(scenario)
                if result.status == "measured":
                    try:
                        run.judge(result)
                    except BaselineError:
                        pass  # an unreadable baseline file: comparison() reports it in the record
        except KeyboardInterrupt:
            run.interrupt(stopped.how)
    return run.finish()


@dataclass
class Stop:
    """How a run was stopped: ``Ctrl-C`` unless a SIGTERM came (``interrupts_as_keyboard_interrupt``)."""

    how: str = "Ctrl-C"


@contextlib.contextmanager
def interrupts_as_keyboard_interrupt() -> Iterator[Stop]:
    """SIGTERM (what CI runners, ``timeout`` and ``kill`` send) raises KeyboardInterrupt in the main thread while
    the block runs, as Ctrl-C does, so a terminated run ends as an interrupted one (its finished scenarios
    written, no baseline) instead of dying with nothing written. Outside the main thread, or when someone else
    already handles SIGTERM, nothing is changed."""
    stop = Stop()
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        yield stop
        return

    def on_term(signum, frame):
        stop.how = "SIGTERM"
        raise KeyboardInterrupt("SIGTERM")

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous)


__all__ = ["ConfigError", "Stop", "interrupts_as_keyboard_interrupt", "Judgement", "RunOutputs", "ScenarioRunner", "SuiteRun", "load_checked_suite", "run_suite", "run_suite_outputs"]
