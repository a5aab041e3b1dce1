"""A folder of suite runs as time series: one value per run (the run's median of the metric) per scenario and
metric, in the order of the runs' own ``created`` timestamps (file names and modification times of downloaded CI
artifacts mean nothing). A run that did not measure a scenario leaves no point (the series skips it, it does not
invent one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from pytest_flashckpt.core.result import RunRecord

DEFAULT_METRICS = ("overhead", "stall_vs_copy", "peak_bytes", "step_time_s", "save_stall_s")


class HistoryError(ValueError):
    """A folder or file that cannot be read as a history; the message names it and the fix."""


@dataclass(frozen=True)
class Run:
    created: str
    commit: str | None
    source: str


@dataclass
class Series:
    scenario: str
    metric: str
    runs: list[Run] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


def read_runs(folder: Path) -> list[tuple[Run, RunRecord]]:
    """Every ``results.json`` under ``folder`` (any depth), oldest first by the time each run recorded."""
    if not folder.is_dir():
        raise HistoryError(f"{folder}: not a folder (name the folder holding the runs' results.json files)")
    found = []
    for path in sorted(folder.rglob("results.json")):
        try:
            record = RunRecord.read_json(path)
        except ValueError as exc:  # its message names the file
            raise HistoryError(f"{exc}; remove it from {folder} or fix it") from None
        if not record.created:
            raise HistoryError(f"{path}: no 'created' timestamp: the runs cannot be ordered")
        found.append((Run(record.created, record.commit, str(path)), record))
    if len(found) < 2:
        raise HistoryError(f"{folder}: {len(found)} results.json found; a history needs at least two runs")
    return sorted(found, key=lambda pair: (pair[0].created, pair[0].source))


def build_series(runs: Sequence[tuple[Run, RunRecord]], metrics: Sequence[str] = DEFAULT_METRICS) -> list[Series]:
    """One series per (scenario, metric) with at least one numeric value, in run order."""
    table: dict[tuple[str, str], Series] = {}
    for run, record in runs:
        for result in record.results:
            if result.status != "measured":
                continue
            for name in metrics:
                value = result.number(name)
                if value is not None:
                    s = table.setdefault((result.id, name), Series(result.id, name))
                    s.runs.append(run)
                    s.values.append(float(value))
    return [table[k] for k in sorted(table)]
