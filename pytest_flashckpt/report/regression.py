"""Regression verdicts against the stored baseline (``RunRecord.comparison``, filled by the baseline code)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from pytest_flashckpt.core.comparison import VERDICT_ORDER, Comparison, RegressionVerdict

from pytest_flashckpt.report.format import MISSING, change, metric, p_value
from pytest_flashckpt.report.tables import escape, table

HEADERS = ["scenario", "metric", "baseline", "current", "change", "p-value", "smallest reachable p", "verdict", "why"]

STATUS_TEXT = {
    "no-baseline": "no stored baseline for this profile yet",
    "other-profile": "the stored baseline belongs to another hardware/software profile, so nothing was compared",
    "disabled": "baseline comparison was turned off for this run",
}


def _verdict_row(v: RegressionVerdict) -> list[str]:
    name = v.metric
    return [
        f"`{v.scenario}`", name, metric(name, v.baseline), metric(name, v.current), _change(name, v),
        p_value(v.p_value), "" if v.smallest_p is None else f"{v.smallest_p:.2g}",
        f"**{v.verdict}**" if v.verdict in ("regressed", "improved", "missing") else v.verdict, escape(v.reason or ""),
    ]


def _change(name: str, v: RegressionVerdict) -> str:
    """Recomputed from baseline and current (pp for fractions); the comparison's own relative ``change`` otherwise."""
    recomputed = change(name, v.baseline, v.current)
    if recomputed == MISSING and isinstance(v.change, (int, float)):
        return f"{v.change * 100:+.1f}%"
    return recomputed


def regression_section(comparison: Comparison | None) -> list[str]:
    lines = ["## Regressions against the baseline", ""]
    if comparison is None:
        lines.append("_No baseline comparison was recorded for this run._")
        return lines
    status, message, baseline = comparison.status, comparison.text, comparison.baseline_path
    where = f" (`{baseline}`, profile `{comparison.baseline_profile_id or '?'}`)" if baseline else ""
    if status != "compared":
        text = STATUS_TEXT.get(status, f"status {status}")
        lines.append(f"_Not compared: {text}{where}.{' ' + escape(str(message)) if message else ''}_")
        return lines
    verdicts = comparison.verdicts
    counts = {word: n for word, n in sorted(comparison.counts().items()) if n}
    summary = ", ".join(f"{n} {word}" for word, n in counts.items()) or "no metrics compared"
    lines.append(f"Compared with the baseline{where}: {summary}.{' ' + escape(str(message)) if message else ''}")
    if verdicts:
        lines += ["", verdict_table(verdicts), "",
                  "Verdicts: **regressed** / **improved** = a significant change beyond the tolerance; ok = within "
                  "it; ~ = beyond it but not significant (the samples overlap); **missing** = the baseline has it, this "
                  "run did not measure it; unguarded = the sample sizes cannot reach p < alpha, so it cannot fail; "
                  "unstable = the baseline's runs (hosts) spread too far apart to gate this metric (its spread is "
                  "in the reason; compare on one machine with `flashckpt ab`) (baselines/README.md)."
                  + (" **not comparable** = the scenario's configuration changed under its name since the baseline "
                     "was stored (the changed keys are in the reason); its numbers are not judged until the baseline "
                     "is refreshed." if any(v.verdict == "not comparable" for v in verdicts) else "")]
    return lines


def _order(v: RegressionVerdict) -> tuple:
    return (VERDICT_ORDER.index(v.verdict) if v.verdict in VERDICT_ORDER else 4, v.scenario, v.metric)


def verdict_table(verdicts: list[RegressionVerdict]) -> str:
    """The one rendering of regression verdicts (the report's section and the CI step summary): what is not ``ok``
    first (regressed, improved, ~), then the ``ok`` rows folded in a ``<details>`` block, so a reader sees what
    changed without scrolling past a hundred ``ok`` rows."""
    attention = sorted((v for v in verdicts if v.verdict != "ok"), key=_order)
    ok = sorted((v for v in verdicts if v.verdict == "ok"), key=_order)
    parts = [table([_verdict_row(v) for v in attention], HEADERS)] if attention else ["Every compared metric is ok."]
    if ok:
        parts += ["", f"<details><summary>{len(ok)} ok verdict{'s' if len(ok) != 1 else ''}</summary>", "",
                  table([_verdict_row(v) for v in ok], HEADERS), "", "</details>"]
    return "\n".join(parts)


def markdown_table(comparison: Comparison) -> str:
    """The comparison as the markdown block appended to ``$GITHUB_STEP_SUMMARY``: status line, then every verdict."""
    lines = ["### pytest-flashckpt baseline comparison", "", comparison.text, ""]
    if comparison.verdicts:
        lines += [verdict_table(comparison.verdicts), ""]
    return "\n".join(lines) + "\n"


def append_step_summary(comparison: Comparison, environ: Mapping[str, str] | None = None) -> Path | None:
    """Append the comparison to the file named by ``GITHUB_STEP_SUMMARY`` (GitHub Actions); None when unset."""
    target = (environ if environ is not None else os.environ).get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    path = Path(target)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(markdown_table(comparison))
    return path
