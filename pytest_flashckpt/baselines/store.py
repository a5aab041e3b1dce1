"""Baseline files: ``baselines/<profile_id>.json``, one per hardware profile, made to be read in a diff.

    {
      "schema_version": 2,
      "profile_id": "cpu-2t-torch2.13.0-078d4d86",
      "profile": {...},                       # what the id hashes: device, threads, versions, kernel
      "scenarios": {
        "attention::eager-s512": {
          "commit": "...", "updated": "...", "probe": "cpu", "kernel": "eager", "rounds": 5,
          "metrics": {"overhead": 1.41, "peak_bytes": 307548160, "step_time_s": 0.61},
          "samples": {"overhead": [...], "step_time_s": [...]},
          "fingerprint": "sha256:...", "config": {"activation.strategy": "none", ...}
        }
      }
    }

Each entry is a ``baselines.entry.BaselineEntry``; its ``fingerprint`` (``config.fingerprint``) says which
configuration the numbers belong to, so the gate calls a scenario changed under its name "not comparable". A file
of an older schema is read through ``config.upgrade`` (entries of schema 1 have no fingerprint).
Keys are sorted and indented so a refreshed baseline shows as a small diff. Saving merges: only the scenarios
that ran are replaced, the others are kept as they were; the file is replaced atomically (temp + rename), and the
read-merge-write holds a lock on the folder (``files.locked``), so two runs saving at once keep both's scenarios.
A file that cannot be read as a baseline (truncated, not JSON, another schema, a wrong-typed entry) is refused,
never replaced: moving it aside automatically would leave a second file in a committed folder and hide a merge
conflict the user should resolve, so the message names the file and the ``mv`` that sets it aside.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_flashckpt.baselines.entry import BaselineEntry, EntryProblem
from pytest_flashckpt.baselines.regression_verdicts import GUARDED, SAMPLED, samples_of
from pytest_flashckpt.baselines.fingerprints import fingerprint, fingerprinted
from pytest_flashckpt.config.upgrade import BASELINE_SCHEMA, UnsupportedSchema, upgrade
from pytest_flashckpt.core.files import UnsafeName, atomic_write, atomic_write_text, locked, remove_stale_temp, safe_name
from pytest_flashckpt.core.numbers import num
from pytest_flashckpt.core.result import Result, RunRecord


class BaselineError(ValueError):
    """A baseline file that cannot be used; the message names the file and what is wrong."""


@dataclass
class Baseline:
    profile_id: str
    profile: dict[str, Any]
    scenarios: dict[str, BaselineEntry] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": BASELINE_SCHEMA, "profile_id": self.profile_id, "profile": self.profile,
                "scenarios": {k: e.to_dict() for k, e in self.scenarios.items()}}

    @classmethod
    def read(cls, path: Path) -> "Baseline":
        """Read and check a baseline file; anything that cannot be used as one (unreadable, a folder, not UTF-8,
        not JSON, another schema, an entry or metric of the wrong type) is a BaselineError naming the file, the
        scenario and key where there is one, and the fix."""
        path = Path(path)
        fix = f"fix it, or move it aside (mv {path} {path}.broken) and rerun with --flashckpt-save-baseline"
        if path.is_dir():
            raise BaselineError(f"{path}: is a directory, not a baseline file; remove or rename it")
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BaselineError(f"{path}: not UTF-8 text (byte offset {exc.start}); {fix}") from None
        except OSError as exc:
            raise BaselineError(f"{path}: cannot be read ({exc.strerror or exc}); check its permissions") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BaselineError(f"{path}: not valid JSON ({exc}); {fix}") from None
        if not isinstance(data, dict) or not isinstance(data.get("scenarios"), dict):
            raise BaselineError(f"{path}: not a pytest-flashckpt baseline (no 'scenarios' mapping); {fix}")
        try:
            data = upgrade(data)
        except UnsupportedSchema as exc:
            raise BaselineError(
                f"{path}: {exc}; use the pytest-flashckpt version that wrote it, or move it aside "
                f"(mv {path} {path}.v{data.get('schema_version')}) and rerun with --flashckpt-save-baseline"
            ) from None
        entries = {}
        for scenario_id, stored in data["scenarios"].items():
            try:
                entries[scenario_id] = BaselineEntry.from_dict(stored)
            except EntryProblem as problem:
                raise BaselineError(f"{path}: scenario {scenario_id!r}: {problem}; {fix}") from None
        profile = data.get("profile")
        return cls(str(data.get("profile_id", "")), dict(profile) if isinstance(profile, dict) else {}, entries)

    def write(self, path: Path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    def update(self, results: list[Result], commit: str | None, updated: str) -> list[str]:
        """Replace the entries of the measured results; returns their ids. Skipped / errored ones are not stored."""
        stored = []
        for result in results:
            if result.status != "measured":
                continue
            self.scenarios[result.id] = entry(result, commit, updated)
            stored.append(result.id)
        return stored


def entry(result: Result, commit: str | None, updated: str) -> BaselineEntry:
    """What a baseline keeps of one result: the guarded metrics, the per-round samples behind the timings, and the
    fingerprint of the scenario's configuration."""
    metrics = {k: v for k, v in result.metrics.items() if k in GUARDED and num(v) is not None}
    samples = {}
    for name in SAMPLED:
        values = samples_of(name, result.samples)
        if values:
            samples[name] = [float(v) for v in values]
    rounds = max((len(v) for v in samples.values()), default=0)
    return BaselineEntry(commit, updated, result.probe, result.kernel, rounds, metrics, samples,
                         fingerprint=fingerprint(result.config), config=fingerprinted(result.config))


def entry_problem(stored: BaselineEntry) -> str | None:
    """What is wrong with one entry (a value the gate reads that is not a finite number), or None."""
    try:
        BaselineEntry.from_dict(stored.to_dict())
    except EntryProblem as problem:
        return str(problem)
    return None


@dataclass(frozen=True)
class Lookup:
    """Where this profile's baseline is (or would be written), and baselines of other profiles found there."""

    directory: Path
    path: Path
    exists: bool
    others: tuple[Path, ...]


def locate(directory: Path, profile_id: str) -> Lookup:
    """Where ``profile_id``'s baseline is in ``directory``; BaselineError when the id cannot name a file there (it
    may come from an input file: ``../x`` or ``/etc/x`` must never pick where a baseline is written)."""
    try:
        safe_name(profile_id, "profile_id")
    except UnsafeName as exc:
        raise BaselineError(str(exc)) from None
    path = Path(directory) / f"{profile_id}.json"
    others = tuple(p for p in sorted(directory.glob("*.json")) if p.name != path.name) if directory.is_dir() else ()
    # anything at the path (a folder, a dangling link) counts: reading it gives the error that names it
    return Lookup(directory, path, path.exists() or path.is_symlink(), others)


def check_saveable(directory: Path, profile_id: str, read: bool = True) -> None:
    """Before a run that will save: ``directory`` can hold baselines and this profile's file, if there, reads as
    a baseline (an unreadable one is never replaced: it may hold scenarios this run does not measure, or a merge
    conflict to resolve; ``read=False`` when the run's gate has read it already). BaselineError naming the file
    and the fix otherwise."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise BaselineError(f"{directory}: the baseline folder is a file; pass --flashckpt-baseline-dir=FOLDER or move the file")
    lookup = locate(directory, profile_id)
    if read and lookup.exists:
        Baseline.read(lookup.path)
    probe = directory if directory.is_dir() else next((p for p in directory.parents if p.exists()), Path("."))
    if not os.access(probe, os.W_OK | os.X_OK):
        raise BaselineError(f"{probe}: not writable, so the baseline cannot be saved there; pass --flashckpt-baseline-dir=FOLDER")


def save_run(directory: Path, record: RunRecord) -> Path:
    """Write or update ``record``'s profile baseline in ``directory`` with the scenarios that ran (the others in the
    file are kept as they were). A file that cannot be read as a baseline is never replaced: BaselineError naming
    it and the fix (the run's front ends check this before measuring, ``check_saveable``). Returns the file written."""
    with locked(directory):  # two runs saving at once: the second reads the first's file and merges into it
        remove_stale_temp(directory)  # what a killed earlier write left
        lookup = locate(directory, record.profile_id)
        baseline = Baseline.read(lookup.path) if lookup.exists else Baseline(record.profile_id, record.profile)
        baseline.profile = record.profile
        baseline.update(record.results, record.commit, record.created)
        baseline.write(lookup.path)
    return lookup.path


BACKUP_SUFFIX = ".bak"


def replace_keeping_previous(path: Path, baseline: Baseline) -> Path | None:
    """Write ``baseline`` to ``path``, first copying the file there (if any) to ``<path>.bak`` (atomically, as
    every write here): a pooling that went wrong is undone with one ``mv``. Returns the backup, or None when
    there was no file before. The caller holds the folder's lock."""
    backup = None
    if path.is_file():
        backup = path.with_name(path.name + BACKUP_SUFFIX)
        with atomic_write(backup) as fh:
            fh.write(path.read_bytes())
    baseline.write(path)
    return backup
