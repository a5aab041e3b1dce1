"""A multi-run ("host-robust") baseline: several suite runs of one profile pooled into one baseline file.

Why: a ratio measured side by side in one run cancels what is slow on the machine *during* that run, but not what
differs *between* machines of one profile (copy and disk bandwidth, a neighbour's load): one host's single run sets
the bar too tight for the next host, and a clean clone fails. A pooled entry keeps every run's samples apart
(``runs``), so the gate (``regression_verdicts.judge_across_runs``) can judge a change against the spread between
runs, and call a metric ``unstable`` where that spread is wider than what the gate is meant to catch.

An entry written here is a superset of a one-run entry (``store.entry``): ``metrics`` and ``samples`` are the pooled
ones (so a reader that knows no ``runs`` still works), plus

    "runs": [{"label": "host-a", "created": "...", "commit": "...", "samples": {"overhead": [...], ...}}, ...]

Exact counts (bytes, FLOPs, files) must agree between the runs: they are the program's, not the machine's; a
disagreement is an error naming both files, since pooling would hide a real difference.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from pytest_flashckpt import metrics as vocabulary
from pytest_flashckpt.baselines.store import Baseline, BaselineError, entry
from pytest_flashckpt.registry import is_exact_probe
from pytest_flashckpt.result import RunRecord


@dataclass(frozen=True)
class LabelledRun:
    """One suite run to pool, with the name its host goes by in the baseline (``runs[].label``)."""

    label: str
    record: RunRecord
    source: str  # the results file, for error messages


def pool(runs: Sequence[LabelledRun]) -> Baseline:
    """One baseline of the profile all ``runs`` share, every scenario measured in at least one of them."""
    if not runs:
        raise BaselineError("no runs to pool: name at least one results.json")
    first = runs[0]
    for run in runs[1:]:
        if run.record.profile_id != first.record.profile_id:
            raise BaselineError(
                f"{run.source}: profile {run.record.profile_id}, but {first.source} is {first.record.profile_id}: a baseline "
                "pools runs of one profile only (pool each profile's runs apart)")
    by_scenario: dict[str, list[tuple[LabelledRun, dict[str, Any]]]] = {}
    for run in runs:
        for result in run.record.results:
            if result.status == "measured":
                by_scenario.setdefault(result.id, []).append((run, entry(result, run.record.commit, run.record.created)))
    baseline = Baseline(first.record.profile_id, first.record.profile)
    for scenario_id, entries in sorted(by_scenario.items()):
        baseline.scenarios[scenario_id] = pooled_entry(scenario_id, entries)
    return baseline


def pooled_entry(scenario_id: str, entries: list[tuple[LabelledRun, dict[str, Any]]]) -> dict[str, Any]:
    """The pooled entry of one scenario from its one-run entries (see the module docstring)."""
    first_run, first = entries[0]
    metrics: dict[str, Any] = {}
    for name in sorted({k for _, e in entries for k in e["metrics"]}):
        values = [(run, e["metrics"][name]) for run, e in entries if name in e["metrics"]]
        if vocabulary.judged_as(name, is_exact_probe(first["probe"])) == "exact":
            differ = [(run, v) for run, v in values if v != values[0][1]]
            slack = vocabulary.METRICS[name].slack
            if differ and not all(values[0][1] and abs(v / values[0][1] - 1) <= slack for _, v in differ):
                run, v = differ[0]
                raise BaselineError(
                    f"{run.source}: {scenario_id} {name} = {v}, but {values[0][0].source} has {values[0][1]}: an exact count "
                    "differs between the runs (different code or settings?); pool runs of the same commit and suite")
            metrics[name] = values[0][1]
    samples: dict[str, list[float]] = {}
    for name in sorted({k for _, e in entries for k in e["samples"]}):
        samples[name] = [v for _, e in entries for v in e["samples"].get(name, [])]
    for name in metrics.keys() | {k for _, e in entries for k in e["metrics"]}:
        if name in metrics:
            continue
        if name in samples:
            metrics[name] = statistics.median(samples[name])
        else:  # a one-reading metric (sampled memory): the median of the runs' readings
            metrics[name] = statistics.median(e["metrics"][name] for _, e in entries if name in e["metrics"])
    return {
        "commit": first["commit"], "updated": max(e["updated"] for _, e in entries), "probe": first["probe"],
        "kernel": first["kernel"], "rounds": first["rounds"], "metrics": dict(sorted(metrics.items())), "samples": samples,
        "runs": [{"label": run.label, "created": e["updated"], "commit": e["commit"], "samples": e["samples"]}
                 for run, e in entries],
    }


def read_runs(paths: Sequence[str | Path], labels: Sequence[str] | None = None) -> list[LabelledRun]:
    """The results files as labelled runs; a label defaults to the file's folder name. Bad files are BaselineErrors
    naming the file."""
    if labels and len(labels) != len(paths):
        raise BaselineError(f"{len(labels)} --label values for {len(paths)} results files: give one per file, in order")
    runs = []
    for i, path in enumerate(paths):
        try:
            record = RunRecord.read_json(Path(path))
        except ValueError as exc:
            raise BaselineError(str(exc)) from None
        label = labels[i] if labels else (Path(path).resolve().parent.name or str(path))
        runs.append(LabelledRun(label, record, str(path)))
    return runs
