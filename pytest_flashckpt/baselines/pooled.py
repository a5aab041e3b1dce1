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
grows one run at a time. ``save_pooled`` adds runs to the profile's file (``add_runs``): the scenarios the runs
measured are pooled with the runs the file holds for them, every other scenario stays as it was, the replaced file
is kept as ``.bak``; ``pool_inputs`` refuses runs that must not be pooled before anything is written. Exact counts (bytes, FLOPs, files) must agree between the runs: they are the program's, not the machine's; a
disagreement is an error naming both files, since pooling would hide a real difference.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from pytest_flashckpt.core import metrics as vocabulary
from pytest_flashckpt.baselines.entry import BaselineEntry, BaselineRun
from pytest_flashckpt.baselines.store import Baseline, BaselineError, entry, locate, replace_keeping_previous
from pytest_flashckpt.core.files import locked, remove_stale_temp
from pytest_flashckpt.core.registry import is_exact_probe
from pytest_flashckpt.core.result import RunRecord


@dataclass(frozen=True)
class LabelledRun:
    """One run to pool: its host's name in the baseline (``runs[].label``), its profile, and its one-run baseline
    entries by scenario (from a results.json, or from a baseline file: an earlier host's run)."""

    label: str
    profile_id: str
    profile: dict[str, Any]
    entries: dict[str, BaselineEntry]
    source: str  # the file, for error messages

    def fingerprints(self) -> set[tuple[str, str, str]]:
        """What identifies this run's measurements whatever file they come in: (scenario, time, samples) of every
        entry with samples. Per-round timings never repeat to the last digit between two runs, so two runs sharing
        one are one run read twice (a results file and the baseline it was pooled into, or a copy of a file)."""
        return {(scenario_id, str(e.updated), json.dumps(e.samples, sort_keys=True))
                for scenario_id, e in self.entries.items() if e.samples}


def from_record(label: str, record: RunRecord, source: str) -> LabelledRun:
    entries = {r.id: entry(r, record.commit, record.created) for r in record.results if r.status == "measured"}
    return LabelledRun(label, record.profile_id, record.profile, entries, source)


def from_baseline(label: str, baseline: Baseline, source: str) -> list[LabelledRun]:
    """A baseline file as runs: a one-run file is one run; a pooled file gives back each run it holds (told apart
    by label, time and commit, so two runs that share a label stay two runs)."""
    plain = {k: e for k, e in baseline.scenarios.items() if not e.runs}
    runs = [LabelledRun(label, baseline.profile_id, baseline.profile, plain, source)] if plain else []
    by_run: dict[tuple[str, str, str], dict[str, BaselineEntry]] = {}
    for scenario_id, e in baseline.scenarios.items():
        for run in e.runs:
            one = dataclasses.replace(e, runs=[], commit=run.commit, updated=run.created, samples=run.samples)
            key = (run.label, str(run.created), str(run.commit))
            by_run.setdefault(key, {})[scenario_id] = one
    runs += [LabelledRun(name, baseline.profile_id, baseline.profile, entries, source)
             for (name, _, _), entries in by_run.items()]
    return runs


def pool(runs: Sequence[LabelledRun]) -> Baseline:
    """One baseline of the profile all ``runs`` share, every scenario measured in at least one of them."""
    if not runs:
        raise BaselineError("no runs to pool: name at least one results.json")
    baseline, _ = add_runs(Baseline(runs[0].profile_id, runs[0].profile), runs, "the new baseline")
    return baseline


@dataclass(frozen=True)
class Changes:
    """What ``add_runs`` did to a baseline: the runs it added (labels), the scenarios it added, the scenarios that
    gained runs, and how many it left as they were."""

    runs: tuple[str, ...]
    added: tuple[str, ...]
    grown: tuple[str, ...]
    unchanged: int
    restarted: tuple[str, ...] = ()

    def describe(self) -> str:
        def some(names: Sequence[str]) -> str:
            return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")

        parts = [f"{len(self.runs)} run(s) added ({some(self.runs)})",
                 f"{len(self.added)} scenario(s) added" + (f" ({some(self.added)})" if self.added else ""),
                 f"{len(self.grown)} scenario(s) gained runs" + (f" ({some(self.grown)})" if self.grown else ""),
                 f"{self.unchanged} unchanged"]
        if self.restarted:
            parts.insert(1, f"{len(self.restarted)} scenario(s) restarted from these runs alone ({some(self.restarted)})")
        return "; ".join(parts)


def add_runs(base: Baseline, runs: Sequence[LabelledRun], base_source: str,
             restart: Sequence[str] = ()) -> tuple[Baseline, Changes]:
    """``base`` with ``runs`` pooled in: every scenario of the runs is pooled with the runs ``base`` already holds
    for it, every other scenario of ``base`` is kept as it was (a run never drops what it did not measure).
    With ``restart`` (scenario ids), only those scenarios are taken from ``runs``, and the runs ``base`` held for
    them are dropped: their entries start afresh from ``runs`` (a scenario whose configuration changed, whose old
    runs can no longer be pooled with new ones); every other scenario is kept as it was.
    BaselineError naming the file when a run is of another profile, is already in ``base`` or given twice, or
    reuses a label of another run (the gate's messages name runs by label), or a scenario to restart is in no run."""
    held = from_baseline(Path(base_source).stem, base, base_source) if base.scenarios else []
    if restart:
        runs, held = _restarting(restart, runs, held)
    for run in runs:
        if run.profile_id != base.profile_id:
            raise BaselineError(
                f"{run.source}: profile {run.profile_id}, but {base_source} is {base.profile_id}: a baseline "
                "pools runs of one profile only (pool each profile's runs apart)")
    held_ids = {id(run) for run in held}
    seen: list[LabelledRun] = list(held)
    for run in runs:
        for other in seen:
            before = f"run {other.label!r} of {base_source}" if id(other) in held_ids else other.source
            if run.fingerprints() & other.fingerprints():
                raise BaselineError(f"{run.source}: the same run as {before} (the same per-round samples at the same "
                                    "time): a run is pooled once; drop it from the command")
            if run.label == other.label:
                raise BaselineError(f"{run.source}: its label {run.label!r} is already that of {before}; name each "
                                    "file's run apart with --label NAME (one per file, in order)")
        seen.append(run)
    touched: dict[str, list[tuple[LabelledRun, BaselineEntry]]] = {}
    for run in runs:
        for scenario_id in run.entries:
            touched.setdefault(scenario_id, [])
    for run in (*held, *runs):
        for scenario_id, e in run.entries.items():
            if scenario_id in touched:
                touched[scenario_id].append((run, e))
    merged = Baseline(base.profile_id, base.profile or (runs[0].profile if runs else {}), dict(base.scenarios))
    for scenario_id, entries in touched.items():
        merged.scenarios[scenario_id] = pooled_entry(scenario_id, entries)
    merged.scenarios = dict(sorted(merged.scenarios.items()))
    added = tuple(sorted(k for k in touched if k not in base.scenarios))
    restarted = tuple(sorted(k for k in touched if k in base.scenarios and k in restart))
    grown = tuple(sorted(k for k in touched if k in base.scenarios and k not in restart))
    return merged, Changes(tuple(r.label for r in runs), added, grown, len(base.scenarios) - len(grown) - len(restarted),
                           restarted)


def _restarting(restart: Sequence[str], runs: Sequence[LabelledRun],
                held: list[LabelledRun]) -> tuple[list[LabelledRun], list[LabelledRun]]:
    """``runs`` cut down to the scenarios in ``restart``, and ``held`` without them (a held run left with no
    scenario is dropped)."""
    names = set(restart)
    measured = {k for run in runs for k in run.entries}
    missing = sorted(names - measured)
    if missing:
        raise BaselineError(f"--restart {missing[0]}: none of the runs given measured it; name a scenario id of "
                            f"these runs (suite::scenario, e.g. {min(measured) if measured else 'checkpoint::save-async'})")
    cut = [dataclasses.replace(run, entries={k: e for k, e in run.entries.items() if k in names}) for run in runs]
    kept = [dataclasses.replace(run, entries={k: e for k, e in run.entries.items() if k not in names}) for run in held]
    return cut, [run for run in kept if run.entries]


def pooled_entry(scenario_id: str, entries: list[tuple[LabelledRun, BaselineEntry]]) -> BaselineEntry:
    """The pooled entry of one scenario from its one-run entries (see the module docstring). Runs of two
    configurations (fingerprints that differ, where both are known) are never pooled."""
    first_run, first = entries[0]
    _same_configuration(scenario_id, entries)
    metrics: dict[str, Any] = {}
    for name in sorted({k for _, e in entries for k in e.metrics}):
        values = [(run, e.metrics[name]) for run, e in entries if name in e.metrics]
        if vocabulary.judged_as(name, is_exact_probe(first.probe)) == "exact":
            differ = [(run, v) for run, v in values if v != values[0][1]]
            slack = vocabulary.METRICS[name].slack
            if differ and not all(values[0][1] and abs(v / values[0][1] - 1) <= slack for _, v in differ):
                run, v = differ[0]
                raise BaselineError(
                    f"{run.source}: {scenario_id} {name} = {v}, but {values[0][0].source} has {values[0][1]}: an exact count "
                    "differs between the runs (different code or settings?); pool runs of the same commit and suite")
            metrics[name] = values[0][1]
    samples: dict[str, list[float]] = {}
    for name in sorted({k for _, e in entries for k in e.samples}):
        samples[name] = [v for _, e in entries for v in e.samples.get(name, [])]
    for name in metrics.keys() | {k for _, e in entries for k in e.metrics}:
        if name in metrics:
            continue
        if name in samples:
            metrics[name] = statistics.median(samples[name])
        else:  # a one-reading metric (sampled memory): the median of the runs' readings
            metrics[name] = statistics.median(e.metrics[name] for _, e in entries if name in e.metrics)
    if len(entries) == 1:  # one run: the entry as it was (a pooled file stays a small diff where nothing pooled)
        return first
    known = next((e for _, e in entries if e.fingerprint is not None), first)
    return BaselineEntry(
        first.commit, max(str(e.updated) for _, e in entries), first.probe, first.kernel, first.rounds,
        dict(sorted(metrics.items())), samples, [BaselineRun(run.label, e.updated, e.commit, e.samples) for run, e in entries],
        known.fingerprint, known.config,
    )


def _same_configuration(scenario_id: str, entries: list[tuple[LabelledRun, BaselineEntry]]) -> None:
    """BaselineError naming both files when two runs measured ``scenario_id`` in two configurations."""
    known = [(run, e) for run, e in entries if e.fingerprint is not None]
    for run, e in known[1:]:
        if e.fingerprint != known[0][1].fingerprint:
            raise BaselineError(
                f"{run.source}: {scenario_id} was measured in another configuration than in {known[0][0].source} "
                f"(fingerprint {e.fingerprint} vs {known[0][1].fingerprint}): pool runs of the same suite settings")


@dataclass(frozen=True)
class Saved:
    """What ``save_pooled`` wrote: the baseline file, the backup of the file it replaced (None when new), and the
    changes."""

    path: Path
    backup: Path | None
    changes: Changes


def save_pooled(directory: Path, runs: Sequence[LabelledRun], *, replace: bool = False, restart: Sequence[str] = ()) -> Saved:
    """Pool ``runs`` into their profile's baseline in ``directory``: added to the runs the file holds (every
    scenario they did not measure kept as it was), or, with ``replace``, a fresh baseline of ``runs`` only; with
    ``restart``, only the scenarios named, each started afresh from ``runs`` (``add_runs``). The
    file it replaces is kept as ``<profile>.json.bak``; a file that cannot be read as a baseline is never
    replaced without ``replace``. Read, merge and write hold the folder's lock, as ``store.save_run`` does."""
    if not runs:
        raise BaselineError("no runs to pool: name at least one results.json")
    lookup = locate(Path(directory), runs[0].profile_id)
    if lookup.exists and not lookup.path.is_file():
        raise BaselineError(f"{lookup.path}: not a file (a folder or a dangling link); move it aside, then pool again")
    with locked(directory):
        remove_stale_temp(directory)
        if lookup.exists and not replace:
            base = Baseline.read(lookup.path)
            if base.profile_id != runs[0].profile_id:
                raise BaselineError(f"{lookup.path}: its profile_id is {base.profile_id!r}, not the {runs[0].profile_id!r} "
                                    "its name says; fix the file or rename it")
        else:
            base = Baseline(runs[0].profile_id, runs[0].profile)
        merged, changes = add_runs(base, runs, str(lookup.path), restart)
        backup = replace_keeping_previous(lookup.path, merged)
    return Saved(lookup.path, backup, changes)
