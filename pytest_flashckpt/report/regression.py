"""Regression verdicts against the stored baseline (``RunRecord.comparison``, filled by the baseline code)."""

from __future__ import annotations

from typing import Any

from pytest_flashckpt.report.format import MISSING, change, metric, p_value
from pytest_flashckpt.report.tables import escape, table

HEADERS = ["scenario", "metric", "baseline", "current", "change", "p-value", "verdict"]

STATUS_TEXT = {
    "no-baseline": "no stored baseline for this profile yet",
    "other-profile": "the stored baseline belongs to another hardware/software profile, so nothing was compared",
    "disabled": "baseline comparison was turned off for this run",
}


def _verdict_row(v: dict[str, Any]) -> list[str]:
    name = str(v.get("metric", "?"))
    word = str(v.get("verdict", "~"))
    return [
        f"`{v.get('scenario', '?')}`", name, metric(name, v.get("baseline")), metric(name, v.get("current")),
        _change(name, v),
        p_value(v.get("p_value")), f"**{word}**" if word in ("regressed", "improved", "missing") else word,
    ]


def _change(name: str, v: dict[str, Any]) -> str:
    """Recomputed from baseline and current (pp for fractions); the comparison's own relative ``change`` otherwise."""
    recomputed = change(name, v.get("baseline"), v.get("current"))
    given = v.get("change")
    if recomputed == MISSING and isinstance(given, (int, float)):
        return f"{given * 100:+.1f}%"
    return recomputed


def regression_section(comparison: dict[str, Any] | None) -> list[str]:
    lines = ["## Regressions against the baseline", ""]
    if comparison is None:
        lines.append("_No baseline comparison was recorded for this run._")
        return lines
    status = str(comparison.get("status", "?"))
    message = comparison.get("message")
    baseline = comparison.get("baseline_path")
    where = f" (`{baseline}`, profile `{comparison.get('baseline_profile_id') or '?'}`)" if baseline else ""
    if status != "compared":
        text = STATUS_TEXT.get(status, f"status {status}")
        lines.append(f"_Not compared: {text}{where}.{' ' + escape(str(message)) if message else ''}_")
        return lines
    verdicts = comparison.get("verdicts") or []
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[str(v.get("verdict", "~"))] = counts.get(str(v.get("verdict", "~")), 0) + 1
    summary = ", ".join(f"{n} {word}" for word, n in sorted(counts.items())) or "no metrics compared"
    lines.append(f"Compared with the baseline{where}: {summary}.{' ' + escape(str(message)) if message else ''}")
    if verdicts:
        order = {"regressed": 0, "missing": 1, "improved": 2, "~": 3, "unguarded": 4, "ok": 5}
        ordered = sorted(verdicts, key=lambda v: (order.get(str(v.get("verdict")), 4), str(v.get("scenario")), str(v.get("metric"))))
        lines += ["", table([_verdict_row(v) for v in ordered], HEADERS), "",
                  "Verdicts: **regressed** / **improved** = a significant change beyond the tolerance; ok = within "
                  "it; ~ = beyond it but not significant (the samples overlap); **missing** = the baseline has it, this "
                  "run did not measure it; unguarded = the sample sizes cannot reach p < alpha, so it cannot fail "
                  "(baselines/README.md)."]
    return lines
