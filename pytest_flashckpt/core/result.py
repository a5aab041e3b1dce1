"""``Result`` (one scenario, plain data) and ``RunRecord`` (one suite run): what the runner returns, what
``results.json`` holds, what baselines and reports read. JSON-serialisable and schema-versioned.

A result keeps its scenario typed (``Result.config``, a ``config.scenario.Scenario``): written once as plain data
(``to_dict``), parsed once when a file is read (``config.record_file.read_record``, after ``config.upgrade``
brought an older schema to this one). The core sits below ``config``, so it knows the scenario only by the
``RecordedScenario`` protocol: what it reads of it itself.

A result's metrics are written through ``Result.record`` (or ``absorb`` of a ``Measurements``): a name outside
the vocabulary (``pytest_flashckpt.core.metrics``) is refused where it is written. Samples and per-rank values are
kept under the metric's own name (``samples["save_stall_s"]``, ``per_rank["peak_bytes"]``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Literal, Protocol

from pytest_flashckpt.core.comparison import Comparison
from pytest_flashckpt.core.files import atomic_write_text
from pytest_flashckpt.core.metrics import CheckedValues, Measurements, MetricValue, record_into
from pytest_flashckpt.core.numbers import num

SCHEMA_VERSION = 2
"""2: the run's wall time (``RunRecord.wall_time_s``); older files are read through ``config.upgrade``."""

Status = Literal["measured", "skipped", "error"]

class RecordedScenario(Protocol):
    """What the core reads of a result's scenario (a ``config.scenario.Scenario``; the core cannot import it)."""

    name: str
    suite: str

    def to_plain(self) -> dict[str, Any]: ...


@dataclass
class Result:
    """Measurements of one scenario. ``metrics`` holds the named metrics of ``pytest_flashckpt.core.metrics`` (``peak_bytes``,
    ``memory_saving``, ``overhead``, ``save_stall_s``...); ``samples`` the per-round (per-save) values behind them and
    ``per_rank`` a distributed scenario's value on each rank, both under the metric's name. Written through
    ``record`` / ``absorb``; a write of a name outside the vocabulary raises ``UnknownMetric``."""

    suite: str
    scenario: str
    status: Status
    config: RecordedScenario  # the typed scenario (config.scenario.Scenario), written as plain data in to_dict
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
        if isinstance(self.config, Mapping):
            raise TypeError(f"Result {self.suite}::{self.scenario}: config is the typed Scenario, not a mapping; pass the "
                            "Scenario itself (a stored one is parsed by config.record_file.read_record)")
        # stored data is taken as it is (a file may hold a metric removed since); later writes are checked
        self.metrics, self.samples, self.per_rank = CheckedValues(self.metrics), CheckedValues(self.samples), CheckedValues(self.per_rank)

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
        """Plain JSON-able data: the scenario as its ``to_plain`` form, the value maps as plain dicts."""
        plain = {f.name: getattr(self, f.name) for f in fields(self)}
        plain.update(config=self.config.to_plain(), metrics=dict(self.metrics), samples={k: list(v) for k, v in self.samples.items()},
                     per_rank={k: list(v) for k, v in self.per_rank.items()}, notes=list(self.notes))
        return plain


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
    wall_time_s: float | None = None  # the suite run's wall time, start to finish (None in files of schema 1)
    # the suite run's CPU time (user + system, this process and the children it waited for: torchrun ranks, Inductor's
    # compile workers), start to finish; None in files written before it was recorded
    cpu_time_s: float | None = None
    # results files of other runs whose compiled rows this run's report shows (--flashckpt-include), each relative to
    # this run's results file's folder; never gated with this run
    included: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(results=[r.to_dict() for r in self.results], notes=list(self.notes), included=list(self.included),
                    comparison=None if self.comparison is None else self.comparison.to_dict())
        return data

    def write_json(self, path: Path) -> None:
        """Write atomically (temp file + rename): a reader never sees half a results file."""
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
