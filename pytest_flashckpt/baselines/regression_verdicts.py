"""Verdicts: one metric of one scenario, baseline vs current -> ``ok`` | ``improved`` | ``regressed`` | ``~`` |
``unstable`` | ``unguarded``.

How each kind of metric is judged, and why:

- **exact** counts (``peak_bytes`` and ``state_bytes`` from the exact ``cpu`` probe, ``step_flops``, ``files``):
  the program is deterministic, so the same code gives the same count to the byte. Any increase is a real
  change in what the program keeps alive, so they are compared exactly (no tolerance: a single extra 1 KiB
  LayerNorm copy in the tiny model is 4e-6 of its peak, below any relative tolerance worth having).
  ``bytes_written`` gets ``1e-4`` relative slack: the tensor bytes are fixed, but container metadata (zip
  entries, pickled names, DCP's ``.metadata``) may vary by a few hundred bytes; 1e-4 of the tiny model's
  ~150 MB checkpoint is ~15 KB, far below what a real change writes (a dropped or duplicated weight/optimizer
  tensor is >= 1 MB there).
- **memory** read by a sampled or allocator probe (``nvml``, ``rss``, ``cuda``), and ``save_extra_peak_bytes``
  with any probe (an async save frees its staging buffers from a writer thread, at a time that varies):
  compared with the memory tolerance (``--flashckpt-memory-tolerance``); no test, one reading per run.
- **ratio** timings (``overhead``: the strategy and its reference ran interleaved, round by round;
  ``stall_vs_copy``: each staged save's stall over a copy of the same state timed just before it), measured side
  by side in the same run, so machine-wide slowness cancels. A regression needs BOTH a median change beyond the timing
  tolerance AND a one-sided Mann-Whitney p-value below alpha on the per-round samples. The tolerance is the
  effect size we care about (and absorbs run-to-run drift the within-run samples cannot see); the test says the
  shift is more than round-to-round noise. Beyond the tolerance but not significant is ``~`` (within noise).
- **across runs**: a baseline entry may hold several runs (``runs``: one host's several runs, or several hosts'
  of one profile; ``baselines.pooled``). Then a ratio is judged against the spread BETWEEN those runs, not only
  within one run's samples: it regresses only beyond the highest run's median by the tolerance, and significantly
  above the within-run scatter placed at that highest level (``judge_across_runs``). A metric whose run medians
  spread more than ``Thresholds.max_spread`` is ``unstable``: reported with its spread, never ok, never failing
  (on that metric the hosts of a profile differ more than the change the gate is meant to catch). A ratio whose run
  medians move more than the timing tolerance between runs of unchanged code on one host (``Metric.run_drift``,
  measured: reports/run-drift.md) is judged at that drift instead (``sampled_limits``).
- **time** (absolute seconds: ``step_time_s``...) depends on who else uses the machine; recorded in baselines,
  judged like ratios only when ``--flashckpt-gate-times`` asks for it.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any, Literal, Sequence

from pytest_flashckpt.core import metrics as vocabulary
from pytest_flashckpt.baselines.entry import BaselineEntry
from pytest_flashckpt.baselines.stats import mann_whitney_greater, smallest_p
from pytest_flashckpt.core.comparison import RegressionVerdict, VerdictNote, VerdictWord
from pytest_flashckpt.core.registry import is_exact_probe

Kind = Literal["exact", "memory", "ratio", "time"]

# which metrics are gated, their kind and exact slack come from the vocabulary (pytest_flashckpt.core.metrics)
GUARDED = vocabulary.GATED
SAMPLED = vocabulary.SAMPLED  # ratios and times: judged on per-round samples, stored with them


@dataclass(frozen=True)
class Thresholds:
    timing_tolerance: float = 0.05  # = the option's default; see options.py for why
    memory_tolerance: float = 0.02
    alpha: float = 0.01
    gate_times: bool = False
    # largest spread between a multi-run baseline's run medians (max / min - 1) that a ratio is still gated at: past
    # it the metric is ``unstable``. 10% = the step slowdown the gate is sized to catch (benchmarks/gate_power.py):
    # a host at the bottom of a wider envelope could hide a change of that size
    max_spread: float = 0.10
    # a host-sensitive ratio (``Metric.host_sensitive``: the staged saves' stall_vs_copy) judged against a baseline
    # whose runs all come from one host: a second machine of the same profile read it far higher with nothing
    # changed (a faster copy makes the stall's fixed part a larger share; baselines/README.md), so below this change
    # it is ``unstable``, never a regression. +150% sits above that measured host difference and below what a save
    # that stops overlapping its copy costs (its stall then becomes the whole copy), so such a regression still fails
    host_tolerance: float = 1.5


def sampled_limits(name: str, thresholds: Thresholds) -> tuple[float, float]:
    """The tolerance and the largest spread of baseline run medians that the sampled metric ``name`` is judged at
    against a stored baseline: the thresholds', widened to the metric's measured run-to-run drift
    (``Metric.run_drift``) where its medians move more than that between runs of unchanged code. Judged at the
    thresholds alone, such a ratio fails clean runs (reports/run-drift.md measures how often). ``flashckpt ab``
    compares two versions interleaved on one machine and keeps the thresholds' tolerance."""
    drift = vocabulary.METRICS[name].run_drift
    return max(thresholds.timing_tolerance, drift), max(thresholds.max_spread, drift)


def metric_kind(name: str, probe: str | None) -> Kind | None:
    """How ``name`` is judged for a result measured with ``probe``; None = not a guarded metric."""
    return vocabulary.judged_as(name, is_exact_probe(probe))


def samples_of(name: str, samples: dict[str, list[float]]) -> list[float] | None:
    """Per-round (per-save) samples behind a ratio or time, stored under the metric's name; None when absent."""
    values = samples.get(name)
    return [float(v) for v in values] if values else None


def _change(baseline: float, current: float) -> float | None:
    return None if baseline == 0 else current / baseline - 1.0


def _row(
    scenario: str, metric: str, baseline: float | None, current: float | None, change: float | None, p: float | None,
    verdict: VerdictWord, smallest: float | None = None, reason: str | None = None, busy_machine: bool = False,
) -> RegressionVerdict:
    return RegressionVerdict(scenario, metric, baseline, current, change, p, verdict, smallest, reason, busy_machine)  # type: ignore[arg-type]


def judge_exact(scenario: str, metric: str, baseline: float, current: float, slack: float = 0.0) -> RegressionVerdict:
    change = _change(baseline, current)
    if current == baseline or (change is not None and abs(change) <= slack):
        verdict: VerdictWord = "ok"
    else:
        verdict = "regressed" if current > baseline else "improved"
    return _row(scenario, metric, baseline, current, change, None, verdict)


def judge_tolerance(scenario: str, metric: str, baseline: float, current: float, tolerance: float) -> RegressionVerdict:
    change = _change(baseline, current)
    if change is None or abs(change) <= tolerance:
        verdict: VerdictWord = "ok" if change is not None or current == baseline else "regressed"
    else:
        verdict = "regressed" if change > 0 else "improved"
    return _row(scenario, metric, baseline, current, change, None, verdict)


NOISE_LIMIT = 3.0  # a run whose rounds scatter > 3x more than the baseline's gets a note (never a pass; see noisy)
NOISE_FLOOR = 0.01  # relative scatter below 1% counts as 1%: a very quiet baseline must not make every run "noisy"


def relative_mad(values: Sequence[float]) -> float:
    """Median absolute deviation over the median: the round-to-round scatter, robust to one wild round."""
    middle = statistics.median(values)
    return statistics.median(abs(v - middle) for v in values) / middle if middle else 0.0


def noisy(baseline: Sequence[float], current: Sequence[float]) -> bool:
    """True when this run's rounds scatter more than NOISE_LIMIT times the baseline's: worth a note (a busy machine
    can shift every round of a run at once), never a reason to pass a regression. A slowdown that also widens the
    scatter is still a slowdown: the rank test's p already says how much the two samples overlap."""
    return relative_mad(current) > NOISE_LIMIT * max(relative_mad(baseline), NOISE_FLOOR)


def judge_sampled(
    scenario: str, metric: str, baseline: Sequence[float], current: Sequence[float], tolerance: float, alpha: float
) -> RegressionVerdict:
    """One sampled metric (per-round / per-save samples), in this order:

    - ``unguarded`` when even complete separation of the samples cannot reach ``alpha`` (the smallest p of the
      exact test, ``smallest_p``, is >= alpha): the metric cannot fail at these sample sizes, whatever it did;
    - ``ok`` when the median change is within ``tolerance`` (p still reported);
    - ``regressed`` / ``improved`` when it is beyond the tolerance AND the one-sided Mann-Whitney p < ``alpha``;
    - ``~`` otherwise: beyond the tolerance but the samples overlap too much to tell it from noise (the reason
      says p and the scatter).
    Every row carries ``smallest_p`` and, unless ok, a ``reason``."""
    base_median, cur_median = statistics.median(baseline), statistics.median(current)
    change = _change(base_median, cur_median)
    floor = smallest_p(len(current), len(baseline))
    if floor >= alpha:
        why = (f"{len(current)} vs {len(baseline)} samples: the smallest p the test can reach is {floor:.3g} >= alpha "
               f"{alpha}, so this metric cannot fail; take more rounds/saves (or a longer baseline)")
        return _row(scenario, metric, base_median, cur_median, change, None, "unguarded", floor, why)
    if change is None:
        return _row(scenario, metric, base_median, cur_median, None, None, "~", floor, "baseline median is 0: no relative change")
    p = mann_whitney_greater(current, baseline) if change >= 0 else mann_whitney_greater(baseline, current)
    scatter = f"this run's samples scatter {relative_mad(current):.1%} (relative MAD), the baseline's {relative_mad(baseline):.1%}"
    if abs(change) <= tolerance:
        return _row(scenario, metric, base_median, cur_median, change, p, "ok", floor)
    if p < alpha:
        word: VerdictWord = "regressed" if change > 0 else "improved"
        why = f"p = {p:.3g} < alpha {alpha}"
        busy = noisy(baseline, current)
        if busy:
            why += f"; {scatter}: a busy machine can shift a whole run, rerun on a quiet one to confirm"
        return _row(scenario, metric, base_median, cur_median, change, p, word, floor, why, busy_machine=busy)
    why = f"changed {change:+.1%} but p = {p:.3g} >= alpha {alpha}: the samples overlap the baseline's ({scatter})"
    return _row(scenario, metric, base_median, cur_median, change, p, "~", floor, why)


def run_spread(medians: Sequence[float]) -> float:
    """How far apart a multi-run baseline's run medians are: max / min - 1 (0 for one run)."""
    low = min(medians)
    return max(medians) / low - 1.0 if low > 0 else float("inf")


def judge_across_runs(
    scenario: str, metric: str, runs: Sequence[Sequence[float]], current: Sequence[float], tolerance: float,
    alpha: float, max_spread: float,
) -> RegressionVerdict:
    """One sampled metric against a baseline of several runs (hosts), each a list of per-round samples:

    - ``unguarded`` when the sample sizes cannot reach ``alpha`` (as ``judge_sampled``);
    - ``unstable`` when the run medians spread more than ``max_spread``: a change of the size the gate is meant to
      catch could be one host sitting higher than another, so it is reported, with the spread, and never fails;
    - ``ok`` when this run's median is inside the runs' envelope widened by ``tolerance`` on both sides;
    - ``regressed`` / ``improved`` when it is beyond the highest (lowest) run's median by more than the tolerance
      AND the one-sided Mann-Whitney test says it is above (below) every run's samples placed at that highest
      (lowest) level (each run scaled to the edge median: the within-run scatter, at the worst host's level);
    - ``~`` otherwise. The row's baseline is the pooled median (every run's samples), its change relative to it;
      the reason says where the envelope was."""
    runs = [list(r) for r in runs if r]
    medians = [statistics.median(r) for r in runs]
    pooled = [v for r in runs for v in r]
    base_median, cur_median = statistics.median(pooled), statistics.median(current)
    change = _change(base_median, cur_median)
    floor = smallest_p(len(current), len(pooled))
    low, high = min(medians), max(medians)
    spread = run_spread(medians)
    envelope = f"{len(runs)} baseline runs, run medians {low:.4g}-{high:.4g} (spread {spread:.1%})"
    if floor >= alpha:
        why = (f"{len(current)} vs {len(pooled)} samples: the smallest p the test can reach is {floor:.3g} >= alpha "
               f"{alpha}, so this metric cannot fail; take more rounds/saves")
        return _row(scenario, metric, base_median, cur_median, change, None, "unguarded", floor, why)
    if spread > max_spread:
        why = (f"{envelope} > the {max_spread:.0%} a ratio is gated at: the runs (hosts) of this profile differ more than "
               f"the change the gate is meant to catch; not judged (compare both versions on one machine: flashckpt ab)")
        return _row(scenario, metric, base_median, cur_median, change, None, "unstable", floor, why)
    if change is None or low <= 0:
        return _row(scenario, metric, base_median, cur_median, None, None, "~", floor, "baseline median is 0: no relative change")
    above, below = cur_median / high - 1.0, cur_median / low - 1.0
    if -tolerance <= below and above <= tolerance:
        return _row(scenario, metric, base_median, cur_median, change, None, "ok", floor)
    worse = above > tolerance
    edge = high if worse else low
    placed = [v * edge / m for r, m in zip(runs, medians) for v in r]  # every run's scatter, at the edge's level
    p = mann_whitney_greater(current, placed) if worse else mann_whitney_greater(placed, current)
    beyond = above if worse else below
    side = f"{beyond:+.1%} beyond the {'highest' if worse else 'lowest'} run's median ({envelope})"
    if p < alpha:
        word: VerdictWord = "regressed" if worse else "improved"
        why = f"{side}; p = {p:.3g} < alpha {alpha}"
        busy = noisy(placed, current)  # as judge_sampled: a note, never a pass
        if busy:
            why += (f"; this run's samples scatter {relative_mad(current):.1%} (relative MAD), the runs' "
                    f"{relative_mad(placed):.1%}: a busy machine can shift a whole run, rerun on a quiet one to confirm")
        return _row(scenario, metric, base_median, cur_median, change, p, word, floor, why, busy_machine=busy)
    why = f"{side} but p = {p:.3g} >= alpha {alpha}: the samples overlap the runs' scatter"
    return _row(scenario, metric, base_median, cur_median, change, p, "~", floor, why)


def _one_host(row: RegressionVerdict, host_tolerance: float) -> RegressionVerdict:
    """A host-sensitive ratio against one host's baseline: only a change beyond ``host_tolerance`` can regress."""
    if row.verdict not in ("regressed", "improved", "~") or row.change is None or abs(row.change) > host_tolerance:
        return row
    why = (f"{row.change:+.1%} vs a baseline of one host's runs; this ratio differs between hosts of one profile with "
           f"nothing changed, so only a change beyond {host_tolerance:+.0%} is judged here: pool a second host's run "
           "(flashckpt pool-baseline) or compare on one machine (flashckpt ab)")
    return dataclasses.replace(row, verdict="unstable", reason=why)


def baseline_runs(name: str, baseline: BaselineEntry) -> list[list[float]]:
    """The per-run samples of ``name`` in a multi-run baseline entry (``runs``), or [] for a one-run entry."""
    found = []
    for run in baseline.runs:
        values = samples_of(name, run.samples)
        if values:
            found.append(values)
    return found


def underpowered(n_baseline: int, n_current: int, alpha: float) -> bool:
    """True when even complete separation of the samples cannot reach ``alpha``: the test can never flag."""
    return smallest_p(n_current, n_baseline) >= alpha


def missing_scenario(scenario: str, why: str) -> RegressionVerdict:
    """A scenario the baseline has that this run did not measure: one row, metric ``*``, no values."""
    return _row(scenario, "*", None, None, None, None, "missing", None, why)  # type: ignore[arg-type]


def not_comparable(scenario: str, why: str) -> RegressionVerdict:
    """A scenario whose configuration changed under its name since the baseline was stored: one row, metric ``*``,
    never regressed or improved (its numbers measure something else)."""
    return _row(scenario, "*", None, None, None, None, "not comparable", None, why)  # type: ignore[arg-type]


def compare_scenario(
    scenario: str,
    baseline: BaselineEntry,
    metrics: dict[str, Any],
    samples: dict[str, list[float]],
    probe: str | None,
    thresholds: Thresholds,
) -> tuple[list[RegressionVerdict], list[VerdictNote]]:
    """Verdict rows for every guarded metric both sides have, and notes (probe changed, too few rounds...)."""
    rows: list[RegressionVerdict] = []
    notes: list[VerdictNote] = []
    base_metrics, base_samples, base_probe = baseline.metrics, baseline.samples, baseline.probe
    for name in GUARDED:
        if not isinstance(base_metrics.get(name), (int, float)):
            continue
        kind = metric_kind(name, probe)
        if kind == "time" and not thresholds.gate_times:
            continue  # an absolute time is recorded, judged only on request: absent from this run, no check is lost
        if not isinstance(metrics.get(name), (int, float)):
            why = "the baseline has this metric, this run did not measure it (a measure pass or a metric was dropped?)"
            rows.append(_row(scenario, name, float(base_metrics[name]), None, None, None, "missing", None, why))  # type: ignore[arg-type]
            continue
        base_value, value = float(base_metrics[name]), float(metrics[name])
        if vocabulary.METRICS[name].kind in ("memory", "sampled") and base_probe != probe:
            notes.append(VerdictNote("probe", f"{scenario}: {name} not compared: baseline probe {base_probe!r}, this run {probe!r}"))
            continue
        if kind == "exact":
            rows.append(judge_exact(scenario, name, base_value, value, vocabulary.METRICS[name].slack))
        elif kind == "memory":
            rows.append(judge_tolerance(scenario, name, base_value, value, thresholds.memory_tolerance))
        elif kind in ("ratio", "time"):  # a time only with gate_times (skipped above otherwise)
            cur = samples_of(name, samples)
            base = samples_of(name, base_samples)
            if not cur or not base:
                row = judge_tolerance(scenario, name, base_value, value, thresholds.timing_tolerance)
                why = (f"no per-{'save' if name == 'stall_vs_copy' else 'round'} samples on "
                       f"{'this run' if not cur else 'the baseline'}'s side: cannot be tested; refresh the baseline")
                row = dataclasses.replace(row, verdict="unguarded", reason=why)  # no test: no change can be told from noise
                notes.append(VerdictNote("unguarded", f"{scenario}: {name} unguarded: {why}"))
                rows.append(row)
                continue
            runs = baseline_runs(name, baseline)
            tolerance, max_spread = sampled_limits(name, thresholds)
            if len(runs) >= 2:
                row = judge_across_runs(scenario, name, runs, cur, tolerance, thresholds.alpha, max_spread)
            else:
                row = judge_sampled(scenario, name, base, cur, tolerance, thresholds.alpha)
                if vocabulary.METRICS[name].host_sensitive and len(baseline.hosts) < 2:
                    row = _one_host(row, thresholds.host_tolerance)
            if row.verdict in ("unguarded", "~", "unstable"):
                notes.append(VerdictNote(row.verdict, f"{scenario}: {name} {row.verdict}: {row.reason}"))  # type: ignore[arg-type]
            elif row.verdict == "regressed" and row.busy_machine:
                notes.append(VerdictNote("busy-machine", f"{scenario}: {name} {row.verdict}: {row.reason}"))
            rows.append(row)
    return rows, notes
