"""A multi-run ("host-robust") baseline: several suite runs of one profile pooled into one baseline file.

Why: a ratio measured side by side in one run cancels what is slow on the machine *during* that run, but not what
differs *between* machines of one profile (copy and disk bandwidth, a neighbour's load): one host's single run sets
the bar too tight for the next host, and a clean clone fails. A pooled entry keeps every run's samples apart
(``runs``), so the gate (``regression_verdicts.judge_across_runs``) can judge a change against the spread between
runs, and call a metric ``unstable`` where that spread is wider than what the gate is meant to catch.

An entry written here is a superset of a one-run entry (``store.entry``): ``metrics`` and ``samples`` are the pooled
ones (so a reader that knows no ``runs`` still works), plus

    "runs": [{"label": "host-a", "created": "...", "commit": "...", "samples": {"overhead": [...], ...}}, ...]

A baseline file can be pooled too (the committed one-run baseline is an earlier host's run), so a pooled baseline
grows one run at a time. Exact counts (bytes, FLOPs, files) must agree between the runs: they are the program's, not the machine's; a
disagreement is an error naming both files, since pooling would hide a real difference.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from pytest_flashckpt.core import metrics as vocabulary
from pytest_flashckpt.baselines.store import Baseline, BaselineError, entry
from pytest_flashckpt.core.registry import is_exact_probe
from pytest_flashckpt.core.result import RunRecord


@dataclass(frozen=True)
class LabelledRun:
    """One run to pool: its host's name in the baseline (``runs[].label``), its profile, and its one-run baseline
    entries by scenario (from a results.json, or from a baseline file: an earlier host's run)."""

    label: str
    profile_id: str
    profile: dict[str, Any]
    entries: dict[str, dict[str, Any]]
    source: str  # the file, for error messages


def from_record(label: str, record: RunRecord, source: str) -> LabelledRun:
    entries = {r.id: entry(r, record.commit, record.created) for r in record.results if r.status == "measured"}
    return LabelledRun(label, record.profile_id, record.profile, entries, source)


def from_baseline(label: str, baseline: Baseline, source: str) -> list[LabelledRun]:
    """A baseline file as runs: a one-run file is one run; a pooled file gives back each run it holds."""
    plain = {k: e for k, e in baseline.scenarios.items() if not e.get("runs")}
    runs = [LabelledRun(label, baseline.profile_id, baseline.profile, plain, source)] if plain else []
    by_label: dict[str, dict[str, dict[str, Any]]] = {}
    for scenario_id, e in baseline.scenarios.items():
        for run in e.get("runs") or ():
            one = {k: v for k, v in e.items() if k != "runs"}
            one.update(commit=run.get("commit"), updated=run.get("created"), samples=run.get("samples") or {})
            by_label.setdefault(str(run.get("label")), {})[scenario_id] = one
    runs += [LabelledRun(name, baseline.profile_id, baseline.profile, entries, source) for name, entries in by_label.items()]
    return runs


def pool(runs: Sequence[LabelledRun]) -> Baseline:
    """One baseline of the profile all ``runs`` share, every scenario measured in at least one of them."""
    if not runs:
        raise BaselineError("no runs to pool: name at least one results.json")
    first = runs[0]
    for run in runs[1:]:
        if run.profile_id != first.profile_id:
            raise BaselineError(
                f"{run.source}: profile {run.profile_id}, but {first.source} is {first.profile_id}: a baseline "
                "pools runs of one profile only (pool each profile's runs apart)")
    by_scenario: dict[str, list[tuple[LabelledRun, dict[str, Any]]]] = {}
    for run in runs:
        for scenario_id, e in run.entries.items():
            by_scenario.setdefault(scenario_id, []).append((run, e))
    baseline = Baseline(first.profile_id, first.profile)
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
    if len(entries) == 1:  # one run: the entry as it was (a pooled file stays a small diff where nothing pooled)
        return first
    return {
        "commit": first["commit"], "updated": max(str(e["updated"]) for _, e in entries), "probe": first["probe"],
        "kernel": first["kernel"], "rounds": first["rounds"], "metrics": dict(sorted(metrics.items())), "samples": samples,
        "runs": [{"label": run.label, "created": e["updated"], "commit": e["commit"], "samples": e["samples"]}
                 for run, e in entries],
    }


def read_runs(paths: Sequence[str | Path], labels: Sequence[str] | None = None) -> list[LabelledRun]:
    """Results files (a suite run each) and baseline files (a one-run baseline, or a pooled one: its runs) as
    labelled runs; a label defaults to the file's folder name (a results file) or its stem (a baseline). Bad files
    are BaselineErrors naming the file."""
    if labels and len(labels) != len(paths):
        raise BaselineError(f"{len(labels)} --label values for {len(paths)} files: give one per file, in order")
    runs: list[LabelledRun] = []
    for i, path in enumerate(paths):
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise BaselineError(f"{path}: cannot read it as a results or baseline file ({exc})") from None
        if isinstance(data, dict) and "scenarios" in data:
            label = labels[i] if labels else Path(path).stem
            runs += from_baseline(label, Baseline.read(Path(path)), str(path))
            continue
        try:
            record = RunRecord.read_json(Path(path))
        except ValueError as exc:
            raise BaselineError(str(exc)) from None
        label = labels[i] if labels else (Path(path).resolve().parent.name or str(path))
        runs.append(from_record(label, record, str(path)))
    return runs
