"""Regression verdicts as terminal lines (the markdown table, for the report and ``$GITHUB_STEP_SUMMARY``, is
``report.regression``)."""

from __future__ import annotations

from typing import Any, Mapping

from pytest_flashckpt.baselines.gate import fmt, fmt_change
from pytest_flashckpt.core.comparison import Comparison, RegressionVerdict

def _change(row: RegressionVerdict) -> str:
    return fmt_change(row.change)


def _p(row: RegressionVerdict) -> str:
    return "" if row.p_value is None else f"{row.p_value:.3g}"


def terminal_lines(comparison: Comparison | Mapping[str, Any]) -> list[str]:
    """Status, then every verdict that is not ``ok``; improvements suggest refreshing the baseline."""
    comparison = Comparison.coerce(comparison)
    warning = "WARNING: " if comparison.status == "other-profile" else ""
    lines = [f"baseline: {warning}{comparison['message']}"]
    for row in comparison.verdicts:
        if row.verdict == "ok":
            continue
        p = f", p={_p(row)}" if row.p_value is not None else ""
        why = f": {row.reason}" if row.reason and row.verdict != "regressed" else ""
        lines.append(
            f"  {row.verdict:>9} {row.scenario} {row.metric}: {fmt(row.baseline)} -> {fmt(row.current)} "
            f"({_change(row) or 'n/a'}{p}){why}"
        )
    if any(row.verdict == "improved" for row in comparison.verdicts):
        lines.append("  improvements found: refresh the baseline with --flashckpt-save-baseline to guard them")
    return lines
