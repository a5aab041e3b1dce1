"""Baseline files: ``baselines/<profile_id>.json``, one per hardware profile, made to be read in a diff.

    {
      "schema_version": 1,
      "profile_id": "cpu-2t-torch2.13.0-078d4d86",
      "profile": {...},                       # what the id hashes: device, threads, versions, kernel
      "scenarios": {
        "attention::eager-s512": {
          "commit": "...", "updated": "...", "probe": "cpu", "kernel": "eager", "rounds": 5,
          "metrics": {"overhead": 1.41, "peak_bytes": 307548160, "step_time_s": 0.61},
          "samples": {"overhead": [...], "step_time_s": [...]}
        }
      }
    }

Keys are sorted and indented so a refreshed baseline shows as a small diff. Saving merges: only the scenarios
that ran are replaced, the others are kept as they were; the file is replaced atomically (temp + rename), and the
read-merge-write holds a lock on the folder (``files.locked``), so two runs saving at once keep both's scenarios.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_flashckpt.baselines.regression_verdicts import GUARDED, SAMPLED, ratio_samples
from pytest_flashckpt.files import atomic_write_text, locked
from pytest_flashckpt.result import Result, RunRecord

BASELINE_SCHEMA = 1


class BaselineError(ValueError):
    """A baseline file that cannot be used; the message names the file and what is wrong."""


@dataclass
class Baseline:
    profile_id: str
    profile: dict[str, Any]
    scenarios: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": BASELINE_SCHEMA, "profile_id": self.profile_id, "profile": self.profile, "scenarios": self.scenarios}

    @classmethod
    def read(cls, path: Path) -> "Baseline":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise BaselineError(f"{path}: not valid JSON ({exc}); fix it or delete it and rerun with --flashckpt-save-baseline") from None
        if not isinstance(data, dict) or not isinstance(data.get("scenarios"), dict):
            raise BaselineError(f"{path}: not a pytest-flashckpt baseline (no 'scenarios' mapping)")
        if data.get("schema_version") != BASELINE_SCHEMA:
            raise BaselineError(
                f"{path}: baseline schema_version {data.get('schema_version')!r} is not supported (this version reads "
                f"{BASELINE_SCHEMA}); regenerate it with --flashckpt-save-baseline"
            )
        return cls(str(data.get("profile_id", "")), dict(data.get("profile") or {}), dict(data["scenarios"]))

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


def entry(result: Result, commit: str | None, updated: str) -> dict[str, Any]:
    """What a baseline keeps of one result: the guarded metrics and the per-round samples behind the timings."""
    metrics = {k: v for k, v in result.metrics.items() if k in GUARDED and isinstance(v, (int, float)) and not isinstance(v, bool)}
    samples = {}
    for name in SAMPLED:
        values = ratio_samples(name, result.samples)
        if values:
            samples[name] = [float(v) for v in values]
    rounds = max((len(v) for v in samples.values()), default=0)
    return {
        "commit": commit, "updated": updated, "probe": result.probe, "kernel": result.kernel, "rounds": rounds,
        "metrics": metrics, "samples": samples,
    }


@dataclass(frozen=True)
class Lookup:
    """Where this profile's baseline is (or would be written), and baselines of other profiles found there."""

    directory: Path
    path: Path
    exists: bool
    others: tuple[Path, ...]


def locate(directory: Path, profile_id: str) -> Lookup:
    path = directory / f"{profile_id}.json"
    others = tuple(p for p in sorted(directory.glob("*.json")) if p.name != path.name) if directory.is_dir() else ()
    return Lookup(directory, path, path.is_file(), others)


def save_run(directory: Path, record: RunRecord) -> Path:
    """Write or update ``record``'s profile baseline in ``directory`` with the scenarios that ran (the others in the
    file are kept as they were); an unreadable file is replaced by this run's. Returns the file written."""
    with locked(directory):  # two runs saving at once: the second reads the first's file and merges into it
        lookup = locate(directory, record.profile_id)
        try:
            baseline = Baseline.read(lookup.path) if lookup.exists else Baseline(record.profile_id, record.profile)
        except BaselineError:
            baseline = Baseline(record.profile_id, record.profile)
        baseline.profile = record.profile
        baseline.update(record.results, record.commit, record.created)
        baseline.write(lookup.path)
    return lookup.path
