"""The regression gate of one suite run: find this profile's baseline, judge each scenario as it finishes,
and produce ``RunRecord.comparison``.

Statuses: ``compared`` (this profile's baseline was read), ``no-baseline`` (none in the folder),
``other-profile`` (baselines exist, but only for other profiles: reported and skipped, never a failure:
another machine's numbers say nothing about this one), ``disabled`` (``--flashckpt-no-compare``).

Coverage: a scenario the baseline holds, of a suite this run ran, that this run did not measure (removed from the
suite file, skipped now, broken) is a ``missing`` verdict (``finish``), and so is a guarded metric the baseline has
and a measured scenario lacks. Missing fails the run unless the subset is intended (``--flashckpt-subset``, or
scenarios deselected with ``-k``/``-m``): then the rows stay, with that reason, and nothing fails.

Configuration: a baseline entry stores its scenario's fingerprint (``config.fingerprint``). A scenario changed under
the same name since (a setting, a default, an axis) is one ``not comparable`` row naming the changed keys, never
regressed or improved, and does not fail the run; refreshing the baseline stores the new configuration. Entries
stored before fingerprints are compared as before, and a note says how many.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from pytest_flashckpt.baselines.entry import BaselineEntry
from pytest_flashckpt.baselines.store import Baseline, BaselineError, locate
from pytest_flashckpt.baselines.regression_verdicts import Thresholds, compare_scenario, missing_scenario, not_comparable
from pytest_flashckpt.baselines.fingerprints import fingerprinted
from pytest_flashckpt.config.fingerprint import changed_keys, same_configuration
from pytest_flashckpt.core.comparison import VERDICT_ORDER, Comparison, RegressionVerdict, VerdictNote
from pytest_flashckpt.core.files import shown_path
from pytest_flashckpt.core.numbers import raw as fmt, relative_change as fmt_change
from pytest_flashckpt.core.result import Result


class Gate:
    def __init__(self, directory: Path, profile_id: str, thresholds: Thresholds, enabled: bool = True,
                 display_root: Path | None = None) -> None:
        self.thresholds = thresholds
        self.lookup = locate(directory, profile_id)
        # paths in messages and the report: relative to the invocation folder (``baselines/<profile>.json``)
        self.shown_path = shown_path(self.lookup.path, display_root)
        self.shown_dir = shown_path(self.lookup.directory, display_root)
        self.profile_id = profile_id
        self.baseline: Baseline | None = None
        self.verdicts: list[RegressionVerdict] = []
        self.notes: list[VerdictNote] = []
        self.not_in_baseline: list[str] = []
        self.without_fingerprint: list[str] = []  # compared scenarios whose entry predates fingerprints
        self.subset: str | None = None
        if not enabled:
            self.status = "disabled"
        elif self.lookup.exists:
            try:
                self.baseline = Baseline.read(self.lookup.path)  # BaselineError names the file ...
            except BaselineError as exc:  # ... as the user types it
                raise BaselineError(str(exc).replace(str(self.lookup.path), self.shown_path)) from None
            self.status = "compared"
        elif self.lookup.others:
            self.status = "other-profile"
        else:
            self.status = "no-baseline"

    def judge(self, result: Result) -> list[RegressionVerdict]:
        """Verdict rows for one measured result (none for skipped results or scenarios the baseline lacks)."""
        if self.baseline is None or result.status != "measured":
            return []
        stored = self.baseline.scenarios.get(result.id)
        if stored is None:
            self.not_in_baseline.append(result.id)
            return []
        changed = self._changed_configuration(result, stored)
        if changed is not None:
            self.verdicts.append(changed)
            self.notes.append(VerdictNote("not-comparable", f"{result.id}: not comparable: {changed.reason}"))
            return [changed]
        rows, notes = compare_scenario(result.id, stored, result.metrics, result.samples, result.probe, self.thresholds)
        self.verdicts.extend(rows)
        self.notes.extend(notes)
        return rows

    def first_look(self, result: Result, metric: str, samples: list[float]) -> RegressionVerdict | None:
        """``metric``'s provisional row when the first look at it (``samples`` so far) reads slower than this
        profile's baseline: None when it does not, or when there is nothing to compare with. Records nothing:
        the scenario is judged once, on all its samples (``judge``)."""
        stored = None if self.baseline is None else self.baseline.scenarios.get(result.id)
        if stored is None or (stored.fingerprint is not None and not _same_configuration(stored, result)):
            return None
        return first_look(stored, result, metric, samples, self.thresholds)

    def _changed_configuration(self, result: Result, stored: BaselineEntry) -> RegressionVerdict | None:
        """The ``not comparable`` row when ``result``'s configuration is not the one ``stored`` was measured with."""
        if stored.fingerprint is None:
            self.without_fingerprint.append(result.id)
            return None
        if _same_configuration(stored, result):
            return None
        keys = changed_keys(stored.config or {}, fingerprinted(result.config))  # type: ignore[arg-type]
        shown = "; ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")
        return not_comparable(result.id, f"the scenario's configuration changed since the baseline was stored "
                              f"({shown or 'the fingerprint differs'}); refresh the baseline (--flashckpt-save-baseline)")

    def finish(self, suites: set[str], results: list[Result], subset: str | None = None) -> list[RegressionVerdict]:
        """``missing`` rows for baseline scenarios of ``suites`` this run did not measure; ``subset`` (why the run
        is a subset on purpose) keeps them from failing. Returns the rows that fail the run."""
        if self.baseline is None:
            return []
        by_id = {r.id: r for r in results}
        failing = []
        for scenario_id, stored in sorted(self.baseline.scenarios.items()):
            if scenario_id.split("::", 1)[0] not in suites:
                continue
            result = by_id.get(scenario_id)
            if result is not None and result.status == "measured":
                continue
            why = "not measured in this run (removed from the suite, or deselected)" if result is None else f"{result.status} in this run: {result.reason}"
            why += f"; the subset is intended ({subset})" if subset else "; pass --flashckpt-subset if the subset is intended, or refresh the baseline"
            row = missing_scenario(scenario_id, why)
            self.verdicts.append(row)
            if not subset:
                failing.append(row)
        if subset is None:
            failing += [r for r in self.verdicts if r.verdict == "missing" and r.metric != "*"]
        self.subset = subset
        return failing

    def note(self, text: str) -> None:
        """A condition of this run's gate a reader must know (``--flashckpt-save-baseline``: reported, not failed)."""
        self.notes.append(VerdictNote("run", text))

    def message(self) -> str:
        """What was compared: the verdict counts, or why nothing was (no baseline, another profile's, disabled)."""
        if self.status == "disabled":
            return "baseline comparison disabled (--flashckpt-no-compare)"
        if self.status == "no-baseline":
            return f"no baseline for profile {self.profile_id} in {self.shown_dir}; create one with --flashckpt-save-baseline"
        if self.status == "other-profile":
            names = ", ".join(p.stem for p in self.lookup.others)
            return (
                f"baselines in {self.shown_dir} are for other profiles ({names}), not this one ({self.profile_id}); "
                "comparison skipped; create this profile's with --flashckpt-save-baseline"
            )
        counts = {v: sum(r.verdict == v for r in self.verdicts) for v in VERDICT_ORDER}
        text = (
            f"compared with {self.shown_path}: {counts['regressed']} regressed, {counts['missing']} missing, "
            + (f"{counts['not comparable']} not comparable (configuration changed), " if counts["not comparable"] else "")
            + f"{counts['improved']} improved, {counts['~']} within noise (~), "
            + (f"{counts['unstable']} unstable (the baseline's runs spread too far to gate), " if counts["unstable"] else "")
            + f"{counts['unguarded']} unguarded "
            f"(cannot fail at these sample sizes), {counts['ok']} ok"
        )
        return text

    def coverage_notes(self) -> list[VerdictNote]:
        """What the counts do not say: a subset on purpose, scenarios this run measured that the baseline lacks."""
        notes = []
        if self.status == "compared" and self.subset:
            notes.append(VerdictNote("coverage", f"a subset on purpose ({self.subset}): missing scenarios do not fail the run"))
        if self.status == "compared" and self.not_in_baseline:
            notes.append(VerdictNote("coverage", f"not in the baseline: {', '.join(self.not_in_baseline)}"))
        if self.status == "compared" and self.without_fingerprint:
            n = len(self.without_fingerprint)
            notes.append(VerdictNote("coverage", f"{n} scenario(s) compared without a configuration check: their baseline "
                                     "entries were stored before fingerprints; the next --flashckpt-save-baseline stores them"))
        return notes

    def _baseline_profile_id(self) -> str | None:
        if self.baseline is not None:
            return self.baseline.profile_id
        if self.status == "other-profile":
            return ", ".join(p.stem for p in self.lookup.others)
        return None

    def comparison(self) -> Comparison:
        """What ``RunRecord.comparison`` holds (the report renders it)."""
        return Comparison(
            status=self.status,  # type: ignore[arg-type]
            baseline_path=self.shown_path if self.status == "compared" else None,
            baseline_profile_id=self._baseline_profile_id(),
            message=self.message(),
            verdicts=list(self.verdicts),
            notes=[*self.coverage_notes(), *self.notes],
        )


def unreadable_baseline(message: str) -> Comparison:
    """The comparison of a run whose baseline file could not be read (the message names the file and the fix)."""
    return Comparison("compared", None, None, message, [])


def failure_text(rows: list[RegressionVerdict], baseline_path: Path | str, thresholds: Thresholds) -> str | None:
    """The failure message of a scenario with regressed metrics, or None when nothing regressed."""
    bad = [r for r in rows if r.verdict in ("regressed", "missing")]
    if not bad:
        return None
    lines = [f"performance regression against {baseline_path}:"]
    for r in bad:
        if r.verdict == "missing":
            lines.append(f"  {r.metric}: missing: {r.reason or 'not measured in this run'}")
            continue
        change = fmt_change(r.change) or "n/a"
        p = "" if r.p_value is None else f", p = {r.p_value:.3g} (alpha {thresholds.alpha})"
        note = f" ({r.reason})" if r.busy_machine else ""
        lines.append(f"  {r.metric}: baseline {fmt(r.baseline)}, current {fmt(r.current)}, change {change}{p}{note}")
    lines.append("if the change is intended, refresh the baseline: pytest --flashckpt-suite=... --flashckpt-save-baseline")
    return "\n".join(lines)


def _same_configuration(stored: BaselineEntry, result: Result) -> bool:
    return same_configuration(stored.fingerprint, stored.config, fingerprinted(result.config))  # type: ignore[arg-type]


SLOWER_FIRST_LOOK = ("regressed", "~")  # the first-look verdicts that ask for confirmation rounds, when slower


def first_look(stored: BaselineEntry, result: Result, metric: str, samples: list[float],
               thresholds: Thresholds) -> RegressionVerdict | None:
    """``metric``'s row judged on ``samples`` alone against ``stored`` when it reads slower (regressed, or beyond
    the tolerance without significance: ``~``), else None. Pure: shared by the gate and benchmarks/gate_power.py."""
    if not samples:
        return None
    rows, _ = compare_scenario(result.id, stored, {metric: statistics.median(samples)}, {metric: list(samples)},
                               result.probe, thresholds)
    row = next((r for r in rows if r.metric == metric), None)
    if row is None or row.verdict not in SLOWER_FIRST_LOOK or (row.change or 0.0) <= 0:
        return None
    return row
