"""Verdicts as text: terminal summary lines and the markdown table appended to ``$GITHUB_STEP_SUMMARY``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pytest_flashckpt.baselines.gate import fmt, fmt_change

MARK = {
    "regressed": "❌ regressed", "missing": "❌ missing", "improved": "✅ improved", "~": "~ within noise",
    "unguarded": "⚠ unguarded (cannot fail)", "ok": "ok",
}


def _change(row: dict[str, Any]) -> str:
    return fmt_change(row["change"])


def _p(row: dict[str, Any]) -> str:
    return "" if row["p_value"] is None else f"{row['p_value']:.3g}"


def markdown_table(comparison: dict[str, Any]) -> str:
    """The comparison as a markdown section: status line, then one row per verdict (ok rows included)."""
    lines = ["### pytest-flashckpt baseline comparison", "", comparison["message"], ""]
    if comparison["verdicts"]:
        lines += [
            "| scenario | metric | baseline | current | change | p | smallest reachable p | verdict | why |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for row in comparison["verdicts"]:
            floor = row.get("smallest_p")
            lines.append(
                f"| {row['scenario']} | {row['metric']} | {fmt(row['baseline'])} | {fmt(row['current'])} | {_change(row)} | "
                f"{_p(row)} | {'' if floor is None else f'{floor:.2g}'} | {MARK.get(row['verdict'], row['verdict'])} | {row.get('reason') or ''} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def append_step_summary(comparison: dict[str, Any], environ: dict[str, str] | None = None) -> Path | None:
    """Append the table to the file named by ``GITHUB_STEP_SUMMARY`` (GitHub Actions); None when unset."""
    target = (environ if environ is not None else os.environ).get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    path = Path(target)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(markdown_table(comparison))
    return path


def terminal_lines(comparison: dict[str, Any]) -> list[str]:
    """Status, then every verdict that is not ``ok``; improvements suggest refreshing the baseline."""
    warning = "WARNING: " if comparison["status"] == "other-profile" else ""
    lines = [f"baseline: {warning}{comparison['message']}"]
    for row in comparison["verdicts"]:
        if row["verdict"] == "ok":
            continue
        p = f", p={_p(row)}" if row["p_value"] is not None else ""
        why = f": {row['reason']}" if row.get("reason") and row["verdict"] != "regressed" else ""
        lines.append(
            f"  {row['verdict']:>9} {row['scenario']} {row['metric']}: {fmt(row['baseline'])} -> {fmt(row['current'])} "
            f"({_change(row) or 'n/a'}{p}){why}"
        )
    if any(row["verdict"] == "improved" for row in comparison["verdicts"]):
        lines.append("  improvements found: refresh the baseline with --flashckpt-save-baseline to guard them")
    return lines
