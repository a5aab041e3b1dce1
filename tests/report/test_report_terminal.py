"""What a suite run prints: a line per scenario, short regression lines, the article's table from the report's
own rows, the heartbeat's timing, and the markdown verdict table leading with what is not ok."""

from __future__ import annotations

import report_synthetic

from pytest_flashckpt.core.comparison import Comparison, VerdictNote
from pytest_flashckpt.core.files import shown_path
from pytest_flashckpt.report.article import article_rows
from pytest_flashckpt.report.regression import regression_section
from pytest_flashckpt.report.terminal import (
    WIDTH, Heartbeat, article_lines, regression_lines, scenario_line, scenario_verdict,
)
from pytest_flashckpt.core.result import RunRecord


def _by_id(record: RunRecord, scenario: str):
    return next(r for r in record.results if r.scenario == scenario)


def test_scenario_line_names_kernel_numbers_and_verdict(record: RunRecord) -> None:
    r = _by_id(record, "medium-s512")
    rows = [v for v in record.comparison.verdicts if v.scenario == r.id]
    verdict = scenario_verdict(r, rows, "compared")
    assert verdict == "regressed"  # the worst of its rows (one regressed, one ok)
    line = scenario_line(r, verdict)
    assert line.startswith("synthetic::medium-s512: kernel ") and "saving " in line and "overhead " in line
    assert line.endswith("-> regressed")
    compact = scenario_line(r, verdict, compact=True)
    assert "kernel" not in compact and len(compact) < len(line)


def test_scenario_verdict_says_why_there_is_none(record: RunRecord) -> None:
    measured, skipped = _by_id(record, "medium-s512"), _by_id(record, "offload")
    assert scenario_verdict(skipped, None, "compared") == "skipped"
    assert scenario_verdict(measured, [], "compared") == "not in the baseline"
    assert scenario_verdict(measured, [], "no-baseline") == "no baseline"
    assert scenario_verdict(measured, [], "disabled") == "not compared"
    assert "SYNTHETIC-SKIP" in scenario_line(skipped)


def test_regression_lines_show_only_what_is_not_ok_in_short_lines() -> None:
    comparison = report_synthetic.comparison()
    comparison.message = "compared with baselines/synthetic.json: 1 regressed, 0 improved, 0 within noise (~), 1 ok"
    comparison.notes = [VerdictNote("~", f"scenario synthetic::s{i} has a note that goes on for a while; " + "and on " * 12)
                        for i in range(30)]
    lines = regression_lines(comparison)
    assert lines[0] == "baseline baselines/synthetic.json: 1 regressed, 1 ok"
    assert any("regressed synthetic::medium-s512 peak_bytes" in line for line in lines)
    assert not any(" ok " in line and "overhead" in line for line in lines)  # ok rows are not listed
    assert max(len(line) for line in lines) <= WIDTH  # each note wrapped to the width, from its own line
    starts = [i for i, line in enumerate(lines) if line.startswith("  scenario synthetic::s")]
    assert len(starts) == 30 and all(b - a == 2 for a, b in zip(starts, starts[1:]))  # one note: two lines
    assert not any("compared with" in line for line in lines)  # the message is the counts line, not repeated


def test_article_lines_render_the_reports_rows(record: RunRecord) -> None:
    lines = article_lines(record)
    rows = article_rows(record)
    for row in rows:
        assert any(row.claim.title in line and row.verdict.word in line for line in lines)


def test_heartbeat_is_due_only_after_the_interval() -> None:
    now = [0.0]
    beat = Heartbeat(interval=5.0, clock=lambda: now[0])
    now[0] = 4.0
    assert not beat.due()
    now[0] = 5.5
    assert beat.due() and not beat.due()  # due once, then it waits again
    now[0] = 9.0
    beat.printed()
    now[0] = 13.0
    assert not beat.due()


def test_markdown_verdicts_lead_with_what_is_not_ok_and_fold_the_ok_rows(record: RunRecord) -> None:
    text = "\n".join(regression_section(record.comparison))
    assert text.index("**regressed**") < text.index("<details><summary>1 ok verdict</summary>") < text.index("| ok ")
    assert "`baselines/synthetic.json`" in text


def test_shown_path_is_relative_to_the_root_below_it(tmp_path) -> None:
    assert shown_path(tmp_path / "baselines" / "x.json", tmp_path) == "baselines/x.json"
    assert shown_path("/elsewhere/x.json", tmp_path) == "/elsewhere/x.json"
    assert shown_path("out/report.md", tmp_path) == "out/report.md"
