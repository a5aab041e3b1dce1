"""The files ``flashckpt pool-baseline`` is given, read as runs to pool, and every run that must not become part
of a baseline refused before anything is written, with the file and the reason:

- a partial run (``interrupted``), a run whose scenarios errored (named), a run that measured nothing: pooling
  them would shrink or hollow out what a baseline guards;
- a run with a regression injected on purpose (``--flashckpt-inject``; recorded in each result's notes): the
  gate would take the injected slowdown as normal;
- a value that is not a finite number (NaN, Infinity, a text) where the gate reads numbers: the baseline written
  could not be read back;
- the same file given twice (by the SHA-256 of its bytes; the same run in another file is caught by its samples,
  ``LabelledRun.fingerprints``);
- a profile id that cannot name a file (``files.safe_name``): it picks the baseline's file name.

A baseline file can be given too (its runs are pooled); the baseline being added to, given again, is skipped.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from pytest_flashckpt.baselines.pooled import LabelledRun, from_baseline, from_record
from pytest_flashckpt.baselines.regression_verdicts import GUARDED, SAMPLED
from pytest_flashckpt.baselines.store import Baseline, BaselineError, entry_problem
from pytest_flashckpt.core.files import UnsafeName, read_regular_bytes, safe_name
from pytest_flashckpt.core.numbers import finite
from pytest_flashckpt.core.result import RunRecord
from pytest_flashckpt.config.record_file import read_record

INJECTED_NOTE = "injected regression"  # how config.injection.Injection.describe starts a result's note


@dataclass(frozen=True)
class Inputs:
    """The runs read, and the files skipped (with why)."""

    runs: list[LabelledRun]
    skipped: list[str]


def _refusal(record: RunRecord) -> str | None:
    """Why a results file's run must not be pooled, or None."""
    if record.interrupted:
        return "an interrupted (partial) run; pool a run that finished every scenario"
    broken = [r.id for r in record.results if r.status == "error"]
    if broken:
        return (f"{len(broken)} scenario(s) errored ({', '.join(broken[:5])}{' ...' if len(broken) > 5 else ''}); "
                "fix them and rerun before pooling")
    injected = sorted({n for r in record.results for n in r.notes if n.startswith(INJECTED_NOTE)}
                      | {n for n in record.notes if n.startswith(INJECTED_NOTE)})
    if injected:
        return f"recorded with a regression injected on purpose ({injected[0]}); never pool such a run"
    if not any(r.status == "measured" for r in record.results):
        return "no scenario was measured (all skipped?); there is nothing to pool"
    return None



def _bad_value(record: RunRecord) -> str | None:
    """The first gated value or sample list of a measured result that is not finite numbers, named, or None.
    ``store.entry`` keeps only numbers, so without this a text where a gated number belongs would silently leave
    that metric unguarded (None is a metric not measurable on this run, and stays allowed)."""
    for r in record.results:
        if r.status != "measured":
            continue
        for name, value in r.metrics.items():
            if name in GUARDED and value is not None and not finite(value):
                return f"scenario {r.id!r}: metrics.{name}: expected a finite number, got {value!r:.60}"
        for name in SAMPLED:
            values = r.samples.get(name)
            if values is not None and not (isinstance(values, list) and all(finite(v) for v in values)):
                return f"scenario {r.id!r}: samples.{name}: expected a list of finite numbers, got {values!r:.60}"
    return None


def _checked(run: LabelledRun) -> LabelledRun:
    try:
        safe_name(run.profile_id, "profile_id")
    except UnsafeName as exc:
        raise BaselineError(f"{run.source}: {exc}") from None
    for scenario_id, e in run.entries.items():
        problem = entry_problem(e)
        if problem is not None:
            raise BaselineError(f"{run.source}: scenario {scenario_id!r}: {problem}; a baseline keeps finite numbers only")
    return run


def read_runs(paths: Sequence[str | Path], labels: Sequence[str] | None = None, target_dir: Path | None = None) -> Inputs:
    """Results files (a suite run each) and baseline files (a one-run baseline, or a pooled one: its runs) as
    labelled runs; a label defaults to the file's folder name (a results file) or its stem (a baseline). The
    profile's own baseline file in ``target_dir`` (the one being added to) is skipped. Bad or refused files are
    BaselineErrors naming the file."""
    if labels and len(labels) != len(paths):
        raise BaselineError(f"{len(labels)} --label values for {len(paths)} files: give one per file, in order")
    runs: list[LabelledRun] = []
    skipped: list[str] = []
    digests: dict[str, str] = {}
    for i, path in enumerate(paths):
        path = Path(path)
        try:
            raw = read_regular_bytes(path)
            data = json.loads(raw.decode("utf-8"))
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested past what json reads
            raise BaselineError(f"{path}: cannot read it as a results or baseline file ({exc or type(exc).__name__})") from None
        digest = hashlib.sha256(raw).hexdigest()
        if digest in digests:
            raise BaselineError(f"{path}: the same file as {digests[digest]} (identical bytes): a run is pooled once; "
                                "drop one of them")
        digests[digest] = str(path)
        if isinstance(data, dict) and "scenarios" in data:
            baseline = Baseline.read(path)
            label = labels[i] if labels else path.stem
            found = [_checked(run) for run in from_baseline(label, baseline, str(path))]
            if target_dir is not None and path.resolve() == (Path(target_dir) / f"{baseline.profile_id}.json").resolve():
                skipped.append(f"{path}: the baseline being added to (its runs stay as they are)")
                continue
            runs += found
            continue
        try:
            record = read_record(path)
        except ValueError as exc:
            raise BaselineError(str(exc)) from None
        refusal = _refusal(record)
        if refusal:
            raise BaselineError(f"{path}: not pooled: {refusal}")
        bad = _bad_value(record)
        if bad:
            raise BaselineError(f"{path}: {bad}; a baseline keeps finite numbers only")
        label = labels[i] if labels else (path.resolve().parent.name or str(path))
        runs.append(_checked(from_record(label, record, str(path))))
    return Inputs(runs, skipped)
