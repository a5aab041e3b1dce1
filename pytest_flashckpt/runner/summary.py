"""The end summary of a suite run, the same for ``pytest --flashckpt-suite`` and ``flashckpt run``: an injected
regression's warning, the article's claims, the baseline verdicts, where the report went, the run's notes, and
why the run is interrupted or failed for missing scenarios."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_flashckpt.report.terminal import article_lines, regression_lines, where_lines, wrap
from pytest_flashckpt.runner.preflight import Flag, pytest_flag

if TYPE_CHECKING:
    from pytest_flashckpt.runner.suite import RunOutputs, SuiteRun


def end_summary(run: "SuiteRun", outputs: "RunOutputs | None", claims: bool = True, flag: Flag = pytest_flag) -> list[str]:
    """The summary's lines; ``outputs`` is None where nothing was written (a pytest-xdist controller with no
    results); ``claims`` False leaves out the article's table (pytest's ``-q``); ``flag`` spells an option as the
    front end does (``runner.preflight.command_flag`` for ``flashckpt run``)."""
    lines: list[str] = []
    if run.options.inject:
        from pytest_flashckpt.config.injection import Injection

        injection = Injection.parse(run.options.inject)
        if injection is not None:
            lines.append(f"WARNING: {injection.describe()} ({flag('flashckpt-inject')}): these are not real measurements")
    record = outputs.record if outputs is not None else run.record()
    if claims:
        lines += article_lines(record)
    lines += regression_lines(record.comparison)
    if outputs is not None:
        lines += where_lines(run.shown(outputs.report_path), run.shown(outputs.results_path),
                             run.shown(outputs.baseline_path) if outputs.baseline_path is not None else None,
                             str(outputs.step_summary) if outputs.step_summary is not None else None)
    for note in run.notes:
        lines += wrap(f"note: {note}", indent="")
    if run.interrupted:
        lines.append(f"INTERRUPTED ({run.stopped_by}): {len(run.results)} of {len(run.suite.scenarios)} scenario(s) "
                     "finished; the report and results.json are marked interrupted; no baseline was updated")
    if run.missing:
        lines.append(
            f"FAILED: {len(run.missing)} scenario(s)/metric(s) of the baseline were not measured (missing); "
            f"pass {flag('flashckpt-subset')} if the subset is intended"
        )
    return lines
