"""One scenario's entry in a baseline file, typed: what the gate reads (``metrics``, ``samples``, pooled ``runs``)
and what says which configuration the numbers belong to (``fingerprint``, ``config``: ``config.fingerprint``).

Its JSON form (``to_dict``) is the file's, key for key: ``runs`` only in a pooled entry, ``fingerprint`` and
``config`` only once stored (entries written before fingerprints have neither; the gate compares them as before and
says so). ``from_dict`` checks every value the gate reads: a value of another type would silently go ungated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pytest_flashckpt.core.numbers import num


class EntryProblem(ValueError):
    """What is wrong with one stored entry (the caller names the file and scenario)."""


@dataclass(frozen=True)
class BaselineRun:
    """One pooled run of an entry: its host's label, when and from which commit, and its own samples."""

    label: str
    created: str | None
    commit: str | None
    samples: dict[str, list[float]]

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "created": self.created, "commit": self.commit, "samples": self.samples}

    @classmethod
    def from_dict(cls, data: Any) -> "BaselineRun":
        if not isinstance(data, dict):
            raise EntryProblem(f"runs: each run must be a mapping, got {type(data).__name__}")
        return cls(str(data.get("label")), data.get("created"), data.get("commit"), _samples(data.get("samples") or {}, "runs[].samples"))


@dataclass
class BaselineEntry:
    """What a baseline keeps of one scenario: the guarded metrics, the per-round (per-save) samples behind the
    sampled ones, the runs they pool (none for a one-run entry), and the fingerprint of the configuration measured."""

    commit: str | None
    updated: str | None
    probe: str | None
    kernel: str | None
    rounds: int
    metrics: dict[str, float]
    samples: dict[str, list[float]]
    runs: list[BaselineRun] = field(default_factory=list)
    fingerprint: str | None = None  # config.fingerprint of the scenario; None: stored before fingerprints
    config: dict[str, Any] | None = None  # the fingerprinted configuration, flat, to name the keys that changed

    @property
    def hosts(self) -> set[str]:
        """The hosts (run labels) this entry pools; a one-run entry is one host."""
        return {run.label for run in self.runs} or {"the baseline's host"}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"commit": self.commit, "updated": self.updated, "probe": self.probe, "kernel": self.kernel,
                               "rounds": self.rounds, "metrics": self.metrics, "samples": self.samples}
        if self.runs:
            out["runs"] = [run.to_dict() for run in self.runs]
        if self.fingerprint is not None:
            out.update(fingerprint=self.fingerprint, config=self.config)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> "BaselineEntry":
        """The entry of a file's mapping; ``EntryProblem`` saying which key is wrong."""
        if not isinstance(data, dict):
            raise EntryProblem(f"the entry must be a mapping, got {type(data).__name__}")
        metrics = data.get("metrics", {})
        if not isinstance(metrics, dict):
            raise EntryProblem(f"metrics must be a mapping of metric names to numbers, got {type(metrics).__name__}")
        for name, value in metrics.items():
            if not _finite(value):
                raise EntryProblem(f"metrics.{name}: expected a finite number, got {type(value).__name__} {value!r:.60}")
        runs = data.get("runs") or []
        if not isinstance(runs, list):
            raise EntryProblem(f"runs must be a list of runs, got {type(runs).__name__}")
        fingerprint, config = data.get("fingerprint"), data.get("config")
        if fingerprint is not None and (not isinstance(fingerprint, str) or not isinstance(config, dict)):
            raise EntryProblem("fingerprint must be a text with its config mapping beside it; refresh the baseline")
        rounds = data.get("rounds", 0)
        return cls(data.get("commit"), data.get("updated"), data.get("probe"), data.get("kernel"),
                   rounds if isinstance(rounds, int) else 0, dict(metrics), _samples(data.get("samples", {}), "samples"),
                   [BaselineRun.from_dict(run) for run in runs], fingerprint, config)


def _finite(value: Any) -> bool:
    return num(value) is not None and math.isfinite(value)


def _samples(samples: Any, key: str) -> dict[str, list[float]]:
    if not isinstance(samples, dict):
        raise EntryProblem(f"{key} must be a mapping of metric names to lists of numbers, got {type(samples).__name__}")
    for name, values in samples.items():
        if not isinstance(values, list) or not all(_finite(v) for v in values):
            raise EntryProblem(f"{key.replace('[]', '')}.{name}: expected a list of finite numbers, got {values!r:.60}")
    return dict(samples)
