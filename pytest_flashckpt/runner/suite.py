"""A suite run, the same for every front end: ``SuiteRun`` holds its state and the per-scenario API, ``run_all`` is
the suite loop outside pytest.

Per scenario, ``step`` runs it through a ``runner.runners.ScenarioRunner`` (the one ``runner_for`` picks from the
scenario: in process, distributed, simulated; or the one ``SuiteRun`` was handed, e.g. a test's fake measurement)
and judges its result against the baseline. ``flashckpt run`` drives ``run_all`` (every scenario in order, then
``finish``); the pytest plugin lets pytest's own loop drive ``step`` (one test item per scenario: -k, -m, xdist)
and calls ``finish`` at the session's end. Both print the same end summary (``runner.summary``). The run's context
(device, probe, profile) is resolved once, in ``runner.context``; baselines are read, judged and saved by
``baselines``; ``finish`` writes ``results.json``, the markdown report and the CI step summary.
See docs/architecture.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

from pytest_flashckpt import __version__
from pytest_flashckpt.baselines import BaselineError, Gate, Thresholds, failure_text, save_run
from pytest_flashckpt.baselines.gate import unreadable_baseline
from pytest_flashckpt.config.axes import is_today
from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.preflight import preflight
from pytest_flashckpt.config.record_file import result_from_dict
from pytest_flashckpt.config.run_options import DEFAULT_REPORT_DIR, Options
from pytest_flashckpt.config.scenario import Scenario
from pytest_flashckpt.config.suites import Suite, load_suite
from pytest_flashckpt.core.comparison import Comparison, RegressionVerdict, VerdictNote
from pytest_flashckpt.core.files import shown_path
from pytest_flashckpt.core.result import Result, RunRecord
from pytest_flashckpt.report.folder import make_report_folder, write_run_folder
from pytest_flashckpt.report.regression import append_step_summary
from pytest_flashckpt.report.terminal import scenario_verdict
from pytest_flashckpt.runner.cards import CardShelf
from pytest_flashckpt.runner.context import RunContext
from pytest_flashckpt.runner.profile import git_commit
from pytest_flashckpt.runner.runners import ScenarioRunner, runner_for


Progress = Callable[[Scenario, str], None]  # (scenario, phase: "memory pass", "timing round 3/5", "save 2/6")


@dataclass(frozen=True)
class Judgement:
    """One scenario's regression verdict rows, and the failure text when a metric regressed (None otherwise;
    also None while ``save_baseline`` refreshes the baseline: then regressions are reported, not failed)."""

    rows: list[RegressionVerdict]
    failure: str | None


@dataclass(frozen=True)
class ScenarioOutcome:
    """One scenario run and judged (``SuiteRun.step``): its result, its one-word verdict, its regression rows, and
    why it fails the run: ``failure`` (the regressions' text; None while the baseline is refreshed) or
    ``baseline_error`` (the baseline file could not be read). Both None: nothing to fail on."""

    result: Result
    verdict: str
    rows: list[RegressionVerdict]
    failure: str | None = None
    baseline_error: str | None = None


@dataclass
class RunOutputs:
    record: RunRecord
    results_path: Path
    report_path: Path
    baseline_path: Path | None = None
    step_summary: Path | None = None


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of the children it has waited for (``os.times``)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def load_checked_suite(name_or_path: str, cards: CardShelf | None = None) -> Suite:
    """Load a suite and preflight every scenario (model cards read, sequences fit): ConfigError before anything runs.
    The cards are read into ``cards`` (hand the same shelf to ``SuiteRun``: each card is then read once per run)."""
    suite = load_suite(name_or_path)
    shelf = cards if cards is not None else CardShelf()
    for scenario in suite.scenarios:
        preflight(scenario, suite.origin(scenario), load=shelf.load)
    check_layouts(suite, shelf)
    return suite


def check_layouts(suite: Suite, shelf: CardShelf) -> None:
    """A tensor-parallel scenario's card family takes torch's plan (``distributed.tensor_parallel.plan_refusal``,
    the model built on meta, once per card), a measured pipeline's stages split the card's blocks
    (``simulate.layouts.stages_refusal``), and a simulated one is a step the engine runs under fake mode
    (``simulate.layouts.engine_cannot_run_scenario``): refused here, naming the suite file, scenario and key, not
    in a rank after launch or by a modelled route that ignores the layout."""
    refused: dict[str, str | None] = {}
    for scenario in suite.scenarios:
        if is_today(scenario.layout):  # FSDP over every rank (Scenario writes it so)
            continue
        if scenario.layout.tensor_parallel and scenario.card not in refused:
            from pytest_flashckpt.distributed.tensor_parallel import plan_refusal  # torch.distributed: only for a layout

            refused[scenario.card] = plan_refusal(shelf.load(scenario.card))
        if refused.get(scenario.card) is not None:
            raise ConfigError(suite.origin(scenario), refused[scenario.card], "",  # the refusal names the fix
                              scenario=scenario.name, key="layout.tp")
        if scenario.layout.pp > 1 and not scenario.simulate.enabled:  # measured stages: the card split as the ranks will
            from pytest_flashckpt.simulate.layouts import stages_refusal

            why = stages_refusal(scenario, shelf.load(scenario.card))
            if why is not None:
                raise ConfigError(suite.origin(scenario), why, "set layout.pp (or the schedule's keys) so the stages "
                                  "split the card's blocks", scenario=scenario.name, key="layout.pp")
        if scenario.simulate.enabled:  # a simulated layout runs the engine under fake mode; the modelled route is FSDP only
            from pytest_flashckpt.simulate.scenario import layout_refusal

            why = layout_refusal(scenario)
            if why is not None:
                axis = "pp" if scenario.layout.pp > 1 else "cp" if scenario.layout.cp > 1 else "tp"
                what = {"pp": "pipeline", "cp": "context-parallel", "tp": "tensor-parallel"}[axis]
                raise ConfigError(suite.origin(scenario), f"{why}, and a {what} layout is simulated only by the engine",
                                  f"set layout.{axis} to 1 (the modelled FSDP route), or change that setting",
                                  scenario=scenario.name, key=f"layout.{axis}")


class SuiteRun:
    """The state of one suite run; ``root`` is the folder relative paths (report, baselines) are resolved from;
    ``runner``, when given, measures every scenario (a test's fake), else each scenario's own (``runner_for``);
    ``cards``: the shelf ``load_checked_suite`` read the suite's model cards into (each card read once per run)."""

    def __init__(self, suite: Suite, options: Options, root: Path | None = None, runner: ScenarioRunner | None = None,
                 progress: Progress | None = None, cards: CardShelf | None = None) -> None:
        self.suite = suite
        self.cards = cards if cards is not None else CardShelf()
        self.options = options
        self.root = Path(root) if root is not None else Path.cwd()
        self.progress = progress  # told (scenario, phase) as a scenario goes: front ends print a heartbeat
        self.results: list[Result] = []
        self.verdicts: dict[str, str] = {}  # scenario id -> one word (report.terminal.scenario_verdict)
        self.notes: list[str] = []  # conditions of the run the report's header states (e.g. parallel xdist workers)
        self.started = datetime.now(timezone.utc)
        self._started_clock = time.monotonic()  # the run's wall time (RunRecord.wall_time_s) is measured from here
        self._started_cpu = cpu_seconds()  # and its CPU time (RunRecord.cpu_time_s)
        self._runner = runner
        self._ctx: RunContext | None = None
        self._gate: Gate | None = None  # made at the first judgement (needs the profile, hence torch)
        self.subset: str | None = "--flashckpt-subset" if options.subset else None  # why a subset is intended
        self.missing: list[RegressionVerdict] = []  # missing rows that fail the run (set by finish)
        self.interrupted = False  # stopped by Ctrl-C / SIGTERM (``interrupt``): finish writes a partial record
        self.stopped_by: str | None = None  # how it was stopped: "Ctrl-C" or "SIGTERM"
        self.finished: RunRecord | None = None  # the record ``finish`` wrote (its comparison is the run's)

    # -- context ------------------------------------------------------------------------------------
    @property
    def context(self) -> RunContext:
        if self._ctx is None:
            o = self.options
            self._ctx = RunContext.resolve(o.device, o.probe, o.workdir or None, o.inject, cards=self.cards)
            self._ctx.dtypes = tuple(s.dtype for s in self.suite.scenarios)
            if o.confirm_rounds and not o.save_baseline and not o.no_compare:
                self._ctx.more_rounds = self.confirmation_rounds
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
        runner = self._runner if self._runner is not None else runner_for(scenario)
        ctx = self.context
        if self.progress is not None:
            progress = self.progress
            ctx.on_phase = lambda phase: progress(scenario, phase)
        try:
            result = runner(scenario, ctx)
        finally:
            ctx.on_phase = None
        self.results.append(result)
        return result

    def step(self, scenario: Scenario) -> ScenarioOutcome:
        """Run one scenario (``run``) and judge it when it was measured (``judge``); an unreadable baseline file is
        the outcome's ``baseline_error``, not an exception."""
        result = self.run(scenario)
        rows: list[RegressionVerdict] = []
        failure = broken = None
        if result.status == "measured":
            try:
                judgement = self.judge(result)
            except BaselineError as exc:
                broken = str(exc)
            else:
                rows, failure = judgement.rows, judgement.failure
        if result.id not in self.verdicts:  # not judged (skipped, error, unreadable baseline): its word, once
            self.verdicts[result.id] = scenario_verdict(result, None, self._gate.status if self._gate else None)
        return ScenarioOutcome(result, self.verdicts[result.id], rows, failure, broken)

    def run_all(self, on_start: Callable[[Scenario], None] | None = None,
                on_outcome: Callable[[ScenarioOutcome], None] | None = None) -> RunOutputs:
        """The suite loop outside pytest: every scenario in order through ``step`` (``on_start`` told before each,
        ``on_outcome`` after), then ``finish``. A Ctrl-C or SIGTERM during a scenario stops the loop; the finished
        scenarios are written as an interrupted record (``RunOutputs.record.interrupted``)."""
        with interrupts_as_keyboard_interrupt() as stopped:
            try:
                for scenario in self.suite.scenarios:
                    if on_start is not None:
                        on_start(scenario)
                    outcome = self.step(scenario)
                    if on_outcome is not None:
                        on_outcome(outcome)
            except KeyboardInterrupt:
                self.interrupt(stopped.how)
        return self.finish()

    def gate(self) -> Gate:
        """The baseline gate of this run (BaselineError when this profile's baseline file is unreadable)."""
        if self._gate is None:
            o = self.options
            thresholds = Thresholds(o.timing_tolerance, o.memory_tolerance, o.alpha, o.gate_times)
            self._gate = Gate(self.baseline_dir, self.context.profile()[1], thresholds, enabled=not o.no_compare,
                              display_root=self.root)
            if o.save_baseline and self._gate.status == "compared":
                self._gate.note("--flashckpt-save-baseline: regressions are reported, not failed; the baseline is refreshed")
        return self._gate

    def confirmation_rounds(self, result: Result, overhead: list[float]) -> int:
        """How many timing rounds to add to ``result``'s first look (``overhead``: its per-round samples so far):
        ``--flashckpt-confirm-rounds`` when it reads slower than this profile's baseline, else 0
        (``runner.confirm``). An unreadable baseline adds none: the judgement reports it."""
        try:
            gate = self.gate()
        except BaselineError:
            return 0
        return self.options.confirm_rounds if gate.first_look(result, "overhead", overhead) is not None else 0

    def judge(self, result: Result) -> Judgement:
        """Regression verdicts of one result against the stored baseline (raises BaselineError for a bad file)."""
        gate = self.gate()
        rows = gate.judge(result)
        self.verdicts[result.id] = scenario_verdict(result, rows, gate.status)
        text = failure_text(rows, gate.shown_path, gate.thresholds)
        return Judgement(rows, None if self.options.save_baseline else text)

    def verdict(self, result: Result) -> str:
        """One word for a finished scenario (its worst verdict, or skipped / error / no baseline ...), as ``step``
        (or the worker that ran it) worded it."""
        return self.verdicts.get(result.id) or scenario_verdict(result, None, self._gate.status if self._gate else None)

    def shown(self, path: Path | str) -> str:
        """``path`` relative to the run's root (the invocation folder) when below it."""
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
            "without_fingerprint": list(gate.without_fingerprint) if gate is not None else [],
        }

    def absorb(self, handoff: dict) -> None:
        """Take another process's ``handoff`` as if this run had measured and judged it (results kept in the
        suite's order)."""
        self.results.extend(result_from_dict(r) for r in handoff.get("results", []))
        order = {f"{s.suite}::{s.name}": i for i, s in enumerate(self.suite.scenarios)}
        self.results.sort(key=lambda r: order.get(r.id, len(order)))
        self.verdicts.update(handoff.get("verdict_words", {}))
        if handoff.get("verdicts") or handoff.get("gate_notes") or handoff.get("not_in_baseline") or handoff.get("without_fingerprint"):
            try:
                gate = self.gate()
            except BaselineError:  # an unreadable baseline file: comparison() reports it
                return
            gate.verdicts.extend(RegressionVerdict.from_dict(v) for v in handoff.get("verdicts", []))
            notes = [VerdictNote.from_dict(n) for n in handoff.get("gate_notes", [])]
            gate.notes.extend(n for n in notes if n not in gate.notes)
            gate.not_in_baseline.extend(handoff.get("not_in_baseline", []))
            gate.without_fingerprint.extend(handoff.get("without_fingerprint", []))

    # -- an interrupted run -------------------------------------------------------------------------
    def interrupt(self, how: str = "Ctrl-C") -> None:
        """The run was stopped (``how``: Ctrl-C, SIGTERM) while a scenario ran: the finished scenarios are kept,
        ``finish`` marks the record interrupted, and no baseline is updated from a partial run."""
        if self.interrupted:
            return
        self.interrupted = True
        self.stopped_by = how
        done = len(self.results)
        self.notes.append(
            f"interrupted ({how}) after {done} of {len(self.suite.scenarios)} scenario(s): a partial run; the scenario "
            "running was dropped and the baseline was not updated"
        )

    # -- the whole run ------------------------------------------------------------------------------
    def comparison(self) -> Comparison:
        """The run's comparison with the baseline: the finished record's, else built from the gate now."""
        if self.finished is not None and self.finished.comparison is not None:
            return self.finished.comparison
        try:
            return self.gate().comparison()
        except BaselineError as exc:
            return unreadable_baseline(str(exc))

    def record(self) -> RunRecord:
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
            wall_time_s=time.monotonic() - self._started_clock,
            cpu_time_s=cpu_seconds() - self._started_cpu,
            included=[os.path.relpath(self.root / path, self.report_dir) for path in self.options.include],
        )

    def finish(self) -> RunOutputs:
        """Save the baseline (when asked), write ``results.json``, the report, and the CI step summary."""
        if self._gate is not None and not self.options.save_baseline and not self.interrupted:
            self.missing = self._gate.finish({s.suite for s in self.suite.scenarios}, self.results, self.subset)
        record = self.finished = self.record()
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


__all__ = ["ConfigError", "Judgement", "RunOutputs", "ScenarioOutcome", "ScenarioRunner", "Stop", "SuiteRun",
           "interrupts_as_keyboard_interrupt", "load_checked_suite"]
