"""``Result`` (one scenario, plain data) and ``RunRecord`` (one suite run): what the runner returns, what
``results.json`` holds, what baselines and reports read. JSON-serialisable and schema-versioned.

A result's metrics are written through ``Result.record`` (or ``absorb`` of a ``Measurements``): a name outside
the vocabulary (``pytest_flashckpt.core.metrics``) is refused where it is written. Samples and per-rank values are
kept under the metric's own name (``samples["save_stall_s"]``, ``per_rank["peak_bytes"]``); files written before
that (``<metric>_samples``, ``<metric>_per_rank`` keys in ``samples``) are read into the same shape."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping

from pytest_flashckpt.core.comparison import Comparison
from pytest_flashckpt.core.files import atomic_write_text, read_regular_bytes
from pytest_flashckpt.core.metrics import METRICS, CheckedValues, Measurements, MetricValue, record_into
from pytest_flashckpt.core.numbers import num

SCHEMA_VERSION = 1

Status = Literal["measured", "skipped", "error"]

# how files written before one sample convention named samples and per-rank values (read, never written)
_LEGACY_SUFFIXES = {"_samples": "samples", "_per_rank": "per_rank"}


def _legacy_lists(samples: Mapping[str, list], per_rank: Mapping[str, list]) -> tuple[dict[str, list], dict[str, list]]:
    """``samples`` and ``per_rank`` of a stored result with the old ``<metric>_samples`` / ``<metric>_per_rank``
    sample keys moved under the metric's own name; every other key stays where it was."""
    out = {"samples": {}, "per_rank": dict(per_rank)}
    for key, values in samples.items():
        for suffix, where in _LEGACY_SUFFIXES.items():
            if key.endswith(suffix) and key[: -len(suffix)] in METRICS:
                out[where][key[: -len(suffix)]] = values
                break
        else:
            out["samples"][key] = values
    return out["samples"], out["per_rank"]


@dataclass
class Result:
    """Measurements of one scenario. ``metrics`` holds the named metrics of ``pytest_flashckpt.core.metrics`` (``peak_bytes``,
    ``memory_saving``, ``overhead``, ``save_stall_s``...); ``samples`` the per-round (per-save) values behind them and
    ``per_rank`` a distributed scenario's value on each rank, both under the metric's name. Written through
    ``record`` / ``absorb``; a write of a name outside the vocabulary raises ``UnknownMetric``."""

    suite: str
    scenario: str
    status: Status
    config: dict[str, Any]
    reason: str | None = None  # why it was skipped, or the error
    device: str = "cpu"
    backend: str | None = None  # the concrete backend asked for (after resolving ``auto``)
    kernel: str | None = None  # the attention kernel detected while it ran
    probe: str | None = None
    metrics: dict[str, MetricValue] = field(default_factory=CheckedValues)
    samples: dict[str, list[float]] = field(default_factory=CheckedValues)
    notes: list[str] = field(default_factory=list)
    per_rank: dict[str, list[float]] = field(default_factory=CheckedValues)

    def __post_init__(self) -> None:
        # stored data is taken as it is (a file may hold a metric removed since); later writes are checked
        samples, per_rank = _legacy_lists(self.samples, self.per_rank)
        self.metrics, self.samples, self.per_rank = CheckedValues(self.metrics), CheckedValues(samples), CheckedValues(per_rank)

    def record(self, metric: str, value: MetricValue, samples: Iterable[float] = (), per_rank: Iterable[float] = ()) -> None:
        """Write ``metric`` (a vocabulary name, ``UnknownMetric`` otherwise) with its value, and the per-round
        samples and per-rank values behind it when there are any."""
        record_into(self.metrics, self.samples, self.per_rank, metric, value, samples, per_rank)

    def number(self, metric: str) -> float | int | None:
        """``metric``'s value when it is a number; None when absent, None or a text (``numbers.num``)."""
        return num(self.metrics.get(metric))

    def absorb(self, measured: Measurements) -> None:
        """Take every value, sample list and per-rank list of ``measured`` (a pass's ``Measurements``)."""
        self.metrics.update(measured.values)
        self.samples.update(measured.samples)
        self.per_rank.update(measured.per_rank)

    @property
    def id(self) -> str:
        return f"{self.suite}::{self.scenario}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Result":
        return cls(**data)


@dataclass
class RunRecord:
    """A whole suite run: the hardware/software profile, when and from which commit, and every result."""

    profile: dict[str, Any]
    profile_id: str
    created: str
    commit: str | None
    suite: str
    device: str
    probe: str
    results: list[Result]
    tool_version: str = ""
    schema_version: int = SCHEMA_VERSION
    comparison: Comparison | None = None  # regression verdicts, when a baseline was compared
    notes: list[str] = field(default_factory=list)  # conditions of the run a reader must know (parallel xdist workers)
    interrupted: bool = False  # stopped by Ctrl-C / SIGTERM: a partial run (its finished scenarios), never a baseline

    def __post_init__(self) -> None:
        self.comparison = Comparison.coerce(self.comparison)  # its JSON form (a mapping) is accepted too

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["results"] = [r.to_dict() for r in self.results]
        return data

    def write_json(self, path: Path) -> None:
        """Write atomically (temp file + rename): a reader never sees half a results file."""
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunRecord":
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(f"results schema_version {version!r} is not supported (this version reads {SCHEMA_VERSION})")
        data = dict(data)
        data["results"] = [Result.from_dict(r) for r in data["results"]]
        return cls(**data)

    @classmethod
    def read_json(cls, path: Path) -> "RunRecord":
        """Load a results file; missing files, bad JSON and other schemas are ValueErrors naming the file. Only a
        regular file is opened: a FIFO named results.json would block the reader forever, a folder would raise."""
        try:
            data = json.loads(read_regular_bytes(path).decode("utf-8"))
        except FileNotFoundError:
            raise ValueError(f"{path}: no such results file (a suite run writes flashckpt-report/results.json)") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not a JSON results file ({exc})") from None
        if not isinstance(data, dict) or "results" not in data:
            raise ValueError(f"{path}: not a pytest-flashckpt results file (no 'results' key)")
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError, AttributeError) as exc:  # AttributeError: a text where a mapping belongs
            raise ValueError(f"{path}: {exc}") from None
