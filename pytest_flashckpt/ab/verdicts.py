"""The A/B gate: B's rounds against A's, with the baseline gate's own rules (``baselines.regression_verdicts``):
a ratio (``overhead``, ``stall_vs_copy``) regresses when the median of B's per-round values is beyond the timing
tolerance above A's AND a one-sided Mann-Whitney test on the per-round values gives p < alpha; exact counts must
be equal; sampled memory within the memory tolerance. The unit of a sample is a round (one process per version):
within-process samples share that process's conditions, so they are not counted as independent.

With no stored baseline the two sides are measured minutes apart on the same machine, so the host differences a
stored baseline has to absorb (``unstable``) cancel by design."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

from pytest_flashckpt.core import metrics as vocabulary
from pytest_flashckpt.ab.provenance import setting_differences, sides_table, versions_table
from pytest_flashckpt.ab.rounds import Rounds
from pytest_flashckpt.ab.suite_source import SuiteSource
from pytest_flashckpt.ab.trees import Tree
from pytest_flashckpt.baselines.regression_verdicts import (
    Thresholds, judge_exact, judge_sampled, judge_tolerance, metric_kind, missing_scenario,
)
from pytest_flashckpt.baselines.stats import smallest_p
from pytest_flashckpt.core.comparison import RegressionVerdict
from pytest_flashckpt.report.regression import verdict_table


@dataclass(frozen=True)
class Outcome:
    rows: list[RegressionVerdict]

    @property
    def failed(self) -> list[RegressionVerdict]:
        return [r for r in self.rows if r.verdict in ("regressed", "missing")]


def _values(records, scenario_id: str, name: str) -> list[float]:
    out = []
    for record in records:
        for result in record.results:
            value = result.number(name) if result.id == scenario_id and result.status == "measured" else None
            if value is not None:
                out.append(float(value))
    return out


def gate(rounds: Rounds, thresholds: Thresholds) -> Outcome:
    """Verdict rows, per scenario A measured, for every gated metric A has."""
    a, b = rounds.records["a"], rounds.records["b"]
    rows: list[RegressionVerdict] = []
    scenarios = sorted({r.id: r for record in a for r in record.results if r.status == "measured"}.items())
    for scenario_id, sample in scenarios:
        if not any(r.id == scenario_id and r.status == "measured" for record in b for r in record.results):
            rows.append(missing_scenario(scenario_id, "A measured it, B did not (skipped or broke in every round)"))
            continue
        for name in vocabulary.GATED:
            base, cur = _values(a, scenario_id, name), _values(b, scenario_id, name)
            if not base:
                continue
            kind = metric_kind(name, sample.probe)
            if not cur:
                rows.append(RegressionVerdict(scenario_id, name, statistics.median(base), None, None, None, "missing",
                                              None, "A measured this metric, B did not"))
                continue
            if kind == "exact":
                rows.append(judge_exact(scenario_id, name, base[0], cur[0], vocabulary.METRICS[name].slack))
            elif kind == "memory":
                rows.append(judge_tolerance(scenario_id, name, statistics.median(base), statistics.median(cur),
                                            thresholds.memory_tolerance))
            elif kind == "ratio" or (kind == "time" and thresholds.gate_times):
                rows.append(judge_sampled(scenario_id, name, base, cur, thresholds.timing_tolerance, thresholds.alpha))
    return Outcome(rows)


@dataclass(frozen=True)
class Job:
    """What an A/B job ran, for its report."""

    trees: dict[str, Tree]
    source: SuiteSource
    rounds: Rounds
    thresholds: Thresholds
    command: str
    minutes: float
    load: tuple[float, float]  # load average (1 min) before and after
    unmeasured: str | None = None  # the repository's uncommitted changes no side ran (provenance.unmeasured_changes)


def markdown(job: Job, outcome: Outcome | None, refused: str | None = None) -> str:
    """The pull-request comment: the verdict (or why none was given), what ran on each side, the suite and where it
    came from, each side's recorded profile and versions, how it was judged, then the verdict table (not-ok rows
    first)."""
    n_rounds = len(job.rounds.records["a"])
    if refused is not None:
        head = f"**no verdict: {refused}**"
    else:
        failed = outcome.failed
        head = (f"**{len(failed)} regressed or missing**" if failed else "no regression") + f" of {len(outcome.rows)} verdicts"
    t = job.thresholds
    lines = [
        "# A/B: B against A on one machine",
        "",
        f"{head}; {job.source.describe()}; {n_rounds} interleaved rounds (one process per version per round, order "
        "alternating).",
        "",
        *([f"> **Warning:** {job.unmeasured}", ""] if job.unmeasured else []),
        *[f"> **Note:** {line}.\n" for line in setting_differences(job.rounds)],
        sides_table(job.trees),
        "",
        versions_table(job.rounds),
        "",
        f"Command: `{job.command}`  ",
        f"Machine: {os.cpu_count()} CPUs, load average (1 min) {job.load[0]:.2f} before, {job.load[1]:.2f} after; "
        f"{job.minutes:.1f} min.  ",
        f"Gate: a ratio regresses when the median of B's rounds is > {t.timing_tolerance:.0%} above A's AND a "
        f"one-sided Mann-Whitney test on the per-round values gives p < {t.alpha} ({n_rounds} vs {n_rounds} "
        f"rounds can reach p = {smallest_p(n_rounds, n_rounds):.2g}); exact counts must be equal.",
        "",
    ]
    if refused is None:
        lines += [verdict_table(outcome.rows) if outcome.rows else "_Nothing to compare: A measured no gated metric._", ""]
    return "\n".join(lines)
