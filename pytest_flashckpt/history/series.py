"""A folder of suite runs as time series: one value per run (the run's median of the metric) per scenario and
metric, in the order of the runs' own ``created`` timestamps (file names and modification times of downloaded CI
artifacts mean nothing). A run that did not measure a scenario leaves no point (the series skips it, it does not
invent one).

A downloaded folder is not trusted: anything named ``results.json`` that is not a regular file (a FIFO would block
the read forever, a folder, a link loop) is skipped unopened (``os.stat`` first), a file that is not a results
file or whose ``created`` is not a time is skipped, and a followed value that is not a finite number (NaN,
Infinity, a text) is dropped; each is a line in ``History.skipped`` / ``History.dropped`` naming the file. The
runs' profile ids are kept: a series that spans two profiles (another machine, torch version, kernel) is cut into
segments there, and change points are found within a segment only (``Series.segments``)."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

from pytest_flashckpt.core.numbers import finite
from pytest_flashckpt.core.result import RunRecord
from pytest_flashckpt.config.record_file import record_from_dict

DEFAULT_METRICS = ("overhead", "stall_vs_copy", "peak_bytes", "step_time_s", "save_stall_s")
RESULTS_NAME = "results.json"


class HistoryError(ValueError):
    """A folder or file that cannot be read as a history; the message names it and the fix."""


@dataclass(frozen=True)
class Run:
    created: str
    commit: str | None
    source: str
    profile_id: str = ""
    profile: tuple[tuple[str, str], ...] = ()  # the profile's fields as text, to say what changed at a boundary


@dataclass
class Series:
    scenario: str
    metric: str
    runs: list[Run] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def segments(self) -> list[range]:
        """The index ranges of consecutive points of one profile; a new profile starts a new segment."""
        bounds = [0] + [i for i in range(1, len(self.runs)) if self.runs[i].profile_id != self.runs[i - 1].profile_id]
        return [range(a, b) for a, b in zip(bounds, bounds[1:] + [len(self.runs)])]


@dataclass
class History:
    """The runs read (oldest first), and what was left out: files skipped and values dropped, one line each."""

    runs: list[tuple[Run, RunRecord]]
    skipped: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def _candidates(folder: Path) -> list[Path]:
    """Every entry named results.json under ``folder``, whatever it is; links to folders are not followed, so a
    link loop cannot make the walk endless."""
    found = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        found += [Path(root) / name for name in (*dirs, *files) if name == RESULTS_NAME]
    return sorted(found)


_KINDS = {stat.S_ISDIR: "a folder", stat.S_ISFIFO: "a FIFO (named pipe)", stat.S_ISSOCK: "a socket",
          stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device"}


def _read_regular(path: Path) -> bytes:
    """The bytes of ``path`` when it is a regular file (links followed); OSError saying what it is otherwise. It is
    never opened unless ``os.stat`` says regular, and opened non-blocking with the type checked again, so a file
    swapped for a FIFO in between cannot block either."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        kind = next((what for test, what in _KINDS.items() if test(mode)), "not a regular file")
        raise OSError(f"{kind}, not a regular file; never opened")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a regular file; never read")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read()
    finally:
        os.close(fd)


def _record(path: Path) -> RunRecord:
    """``path`` as a run record, or ValueError / OSError saying why not."""
    try:
        data = json.loads(_read_regular(path).decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    except RecursionError:
        raise ValueError("JSON nested too deep to be a results file") from None
    if not isinstance(data, dict) or "results" not in data:
        raise ValueError("not a pytest-flashckpt results file (no 'results' key)")
    record = record_from_dict(data)
    if not isinstance(record.created, str) or not record.created:
        raise ValueError(f"'created' is {record.created!r}, not a timestamp text, so the run cannot be ordered")
    try:
        datetime.fromisoformat(record.created)
    except ValueError:
        raise ValueError(f"'created' {record.created!r:.60} is not an ISO time, so the run cannot be ordered") from None
    if not isinstance(record.results, list):
        raise ValueError("'results' is not a list")
    return record


def _profile_fields(profile: Any) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), str(v)) for k, v in profile.items())) if isinstance(profile, dict) else ()


def read_runs(folder: Path) -> History:
    """Every ``results.json`` under ``folder`` (any depth), oldest first by the time each run recorded; files that
    cannot be runs are skipped with a line saying why. HistoryError when the folder is not one or fewer than two
    runs are left."""
    if not folder.is_dir():
        raise HistoryError(f"{folder}: not a folder (name the folder holding the runs' results.json files)")
    history = History([])
    for path in _candidates(folder):
        try:
            record = _record(path)
        except (OSError, UnicodeDecodeError, ValueError, TypeError, AttributeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            history.skipped.append(f"{path}: {reason}; file skipped")
            continue
        run = Run(record.created, record.commit if isinstance(record.commit, str) else None, str(path),
                  str(record.profile_id), _profile_fields(record.profile))
        history.runs.append((run, record))
    if len(history.runs) < 2:
        skipped = f" ({len(history.skipped)} skipped: {history.skipped[0]})" if history.skipped else ""
        raise HistoryError(f"{folder}: {len(history.runs)} results.json read{skipped}; a history needs at least two runs")
    history.runs.sort(key=lambda pair: (pair[0].created, pair[0].source))
    return history



def build_series(history: History, metrics: Sequence[str] = DEFAULT_METRICS) -> list[Series]:
    """One series per (scenario, metric) with at least one finite value, in run order; a value that is not a finite
    number is dropped (a line in ``history.dropped``; None, a metric not measurable on that run, is no point)."""
    table: dict[tuple[str, str], Series] = {}
    for run, record in history.runs:
        for result in record.results:
            if result.status != "measured":
                continue
            for name in metrics:
                value = result.metrics.get(name)
                if value is None:
                    continue
                if not finite(value):
                    history.dropped.append(f"{run.source}: {result.id} {name} = {value!r:.40}: not a finite number; "
                                           "value dropped")
                    continue
                s = table.setdefault((result.id, name), Series(result.id, name))
                s.runs.append(run)
                s.values.append(float(value))
    return [table[k] for k in sorted(table)]
