"""Two runs side by side, as markdown for a pull-request comment: per scenario and metric, A, B and the change.

Scenarios are matched by id (``suite::scenario``). Absolute times only mean something within one hardware
profile, so a profile mismatch is said at the top; ratios (overhead, saving) travel better.
"""

from __future__ import annotations

from pathlib import Path

from pytest_flashckpt.core.claims import CLAIMS
from pytest_flashckpt.core.metrics import COMPARED
from pytest_flashckpt.report import select
from pytest_flashckpt.report.format import change, metric
from pytest_flashckpt.report.tables import escape, table
from pytest_flashckpt.report.claim_verdicts import judge, judge_row
from pytest_flashckpt.core.result import Result, RunRecord

DEFAULT_METRICS = COMPARED  # the vocabulary says which metrics a comparison shows by default


def _describe(label: str, path: Path | str, record: RunRecord) -> str:
    return f"- **{label}** `{path}`: suite `{record.suite}`, profile `{record.profile_id}`, commit `{record.commit or 'unknown'}`, {record.created}"


def _value(r: Result | None, name: str) -> object:
    if r is None:
        return None
    return r.metrics.get(name)


def _status(r: Result | None) -> str:
    if r is None:
        return "not in this run"
    return r.status if r.status == "measured" else escape(f"{r.status}: {r.reason or 'no reason given'}")


def compare_markdown(
    a: RunRecord, b: RunRecord, a_name: Path | str = "A", b_name: Path | str = "B", metrics: tuple[str, ...] = DEFAULT_METRICS
) -> str:
    lines = ["# pytest-flashckpt: run A vs run B", "", _describe("A", a_name, a), _describe("B", b_name, b), ""]
    if a.profile_id != b.profile_id:
        lines += [
            f"> Profiles differ (`{a.profile_id}` vs `{b.profile_id}`): absolute times and bandwidths compare "
            "different machines; ratios (memory saving, overhead) are the fairer comparison.",
            "",
        ]
    by_a = {r.id: r for r in a.results}
    by_b = {r.id: r for r in b.results}
    ids = [*by_a, *(i for i in by_b if i not in by_a)]
    rows, unmatched = [], []
    for rid in ids:
        ra, rb = by_a.get(rid), by_b.get(rid)
        if ra is None or rb is None or ra.status != "measured" or rb.status != "measured":
            unmatched.append([f"`{rid}`", _status(ra), _status(rb)])
            continue
        for name in metrics:
            va, vb = _value(ra, name), _value(rb, name)
            if va is None and vb is None:
                continue
            rows.append([f"`{rid}`", name, metric(name, va), metric(name, vb), change(name, va, vb)])
    if rows:
        lines.append(table(rows, ["scenario", "metric", "A", "B", "change"]))
        lines += ["", "Change: B against A, relative (%), or in percentage points (pp) for fractions such as memory saving."]
    else:
        lines.append("_No scenario was measured in both runs._")
    if unmatched:
        lines += ["", "Not compared (missing or not measured in one run):", "", table(unmatched, ["scenario", "A", "B"])]
    lines += _claims(a, b)
    return "\n".join(lines) + "\n"


def _verdict(record: RunRecord, claim_id: str) -> str:
    tagged = select.by_article(record.results).get(claim_id, [])
    return judge_row(CLAIMS[claim_id], tagged).word if tagged else judge(CLAIMS[claim_id], None).word


def _claims(a: RunRecord, b: RunRecord) -> list[str]:
    """The article's claims, verdict in A vs in B: a pull request that flips one is worth a look."""
    rows = [[CLAIMS[c].title, _verdict(a, c), _verdict(b, c)] for c in CLAIMS]
    if all(row[1] == row[2] == "not measurable" for row in rows):
        return []
    return ["", "The article's claims:", "", table(rows, ["claim", "verdict in A", "verdict in B"])]

