"""How far a ratio's run median moves between runs of unchanged code on one host, and what that does to the gate:
``python benchmarks/run_drift.py --baseline FILE RESULTS.json ...`` (seconds; no torch, nothing rerun).

Inputs: suite runs of one profile (``results.json`` of ``pytest --flashckpt-suite ... --flashckpt-no-compare``,
back to back, nothing changed between them) and that profile's pooled baseline, whose runs count as runs too.
Writes ``reports/run-drift.md`` and ``.json`` (``--out``):

- each scenario's run medians of the metric (default ``stall_vs_copy``), their spread (max / min - 1) and their
  standard deviation relative to their mean (the between-run drift the within-run samples cannot see);
- every run judged against the committed baseline with the real gate (``compare_scenario``), as README's first
  command judges it: the false alarms a clean run meets at the shipped settings;
- a tolerance sweep on every (two-run baseline, third run) choice from the runs (``judge_across_runs``, the spread
  limit as ``sampled_limits`` widens it): the false-alarm rate, and the detection rate of the same run with its
  samples scaled by ``1 + --inject`` (gate_power's ``stall=0.25`` injection moved the median +26.7%). The choices
  reuse runs, so they are not independent trials; the rates say where a tolerance sits, not a confidence interval.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
from pathlib import Path

from pytest_flashckpt.baselines.regression_verdicts import Thresholds, compare_scenario, judge_across_runs, sampled_limits
from pytest_flashckpt.baselines.store import Baseline
from pytest_flashckpt.config.record_file import read_record
from pytest_flashckpt.core import metrics as vocabulary

ROOT = Path(__file__).resolve().parents[1]
TOLERANCES = (0.05, 0.10, 0.15, 0.20)


def shown(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def collect(baseline: Baseline, records: list, metric: str) -> dict[str, list[tuple[str, list[float]]]]:
    """scenario -> [(run label, samples)], the baseline's runs first, then each results file's."""
    runs: dict[str, list[tuple[str, list[float]]]] = {}
    for name, entry in baseline.scenarios.items():
        for run in entry.runs:
            if run.samples.get(metric):
                runs.setdefault(name, []).append((f"baseline {run.label}", [float(v) for v in run.samples[metric]]))
    for label, record in records:
        for result in record.results:
            if result.status == "measured" and result.samples.get(metric) and result.id in runs:
                runs[result.id].append((label, [float(v) for v in result.samples[metric]]))
    return runs


def sweep(runs: list[list[float]], metric: str, inject: float,
          tolerances: tuple[float, ...] = TOLERANCES) -> dict[float, dict[str, int]]:
    """False alarms and detections over every (two-run baseline, third run) choice, per tolerance."""
    out = {}
    alpha, base_spread = Thresholds.alpha, Thresholds.max_spread
    for tol in tolerances:
        counts = {"trials": 0, "false_alarms": 0, "unstable": 0, "detected": 0}
        spread_limit = max(base_spread, tol)  # as sampled_limits widens it for a metric whose run_drift is tol
        for i, j in itertools.combinations(range(len(runs)), 2):
            for k in range(len(runs)):
                if k in (i, j):
                    continue
                clean = judge_across_runs("s", metric, [runs[i], runs[j]], runs[k], tol, alpha, spread_limit)
                slow = judge_across_runs("s", metric, [runs[i], runs[j]], [v * (1 + inject) for v in runs[k]], tol, alpha,
                                         spread_limit)
                counts["trials"] += 1
                counts["false_alarms"] += clean.verdict == "regressed"
                counts["unstable"] += clean.verdict == "unstable"
                counts["detected"] += slow.verdict == "regressed"
        out[tol] = counts
    return out


def _rows(baseline: Baseline, record, metric: str, thresholds: Thresholds, scale: float = 1.0) -> list:
    """The gate's rows on ``metric`` for every scenario of ``record`` the baseline holds, the run's samples (and
    median) multiplied by ``scale`` (1: as measured)."""
    rows = []
    for result in record.results:
        stored = baseline.scenarios.get(result.id)
        if result.status != "measured" or stored is None or not result.samples.get(metric):
            continue
        samples = {**result.samples, metric: [v * scale for v in result.samples[metric]]}
        metrics = {**result.metrics, metric: result.metrics[metric] * scale}
        judged, _ = compare_scenario(result.id, stored, metrics, samples, result.probe, thresholds)
        rows += [r for r in judged if r.metric == metric]
    return rows


def _verdicts(baseline: Baseline, record, metric: str, thresholds: Thresholds, scale: float = 1.0) -> list[str]:
    return [r.verdict for r in _rows(baseline, record, metric, thresholds, scale)]


def gate_per_tolerance(baseline: Baseline, records: list, metric: str, inject: float, tolerances: tuple[float, ...],
                       data: dict) -> list[str]:
    """The committed baseline's real gate with ``metric`` judged at each tolerance (as if its run drift were that):
    each run's false alarms, and the same run's samples scaled by ``1 + inject``."""
    lines = ["", f"## The committed baseline's gate per tolerance (each run as it is, and its samples x {1 + inject:g})",
             "", "The real gate (`compare_scenario`, the committed baseline's runs) at each tolerance of the sweep for "
             f"`{metric}` (the spread limit widened with it, as `sampled_limits` does). A run's injected copy keeps "
             "the rounds it measured: a real slower run adds confirmation rounds more often, so the detection here is "
             "a lower bound.", "",
             "| tolerance | runs | runs with a false alarm | rows judged | false alarms | injected rows regressed | "
             "injected runs failed |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    data["against_baseline_per_tolerance"] = {}
    shipped = vocabulary.METRICS[metric]
    for tol in tolerances:
        vocabulary.METRICS[metric] = dataclasses.replace(shipped, run_drift=tol)  # sampled_limits reads it
        try:
            clean = [_verdicts(baseline, record, metric, Thresholds()) for _, record in records]
            slower = [_verdicts(baseline, record, metric, Thresholds(), 1 + inject) for _, record in records]
        finally:
            vocabulary.METRICS[metric] = shipped
        rows = sum(len(v) for v in clean)
        counts = {"runs": len(records), "runs_with_false_alarm": sum("regressed" in v for v in clean), "rows": rows,
                  "false_alarms": sum(v.count("regressed") for v in clean),
                  "injected_regressed": sum(v.count("regressed") for v in slower),
                  "injected_runs_failed": sum("regressed" in v for v in slower)}
        lines.append(f"| {tol:.0%} | {len(records)} | {counts['runs_with_false_alarm']} | {rows} | "
                     f"{counts['false_alarms']} | {counts['injected_regressed']} of {rows} | "
                     f"{counts['injected_runs_failed']} of {len(records)} |")
        data["against_baseline_per_tolerance"][str(tol)] = counts
    return lines


def injected_runs(baseline: Baseline, paths: list[Path], metric: str, data: dict) -> list[str]:
    """Runs made with a real ``--flashckpt-inject``, each judged by the real gate at the shipped settings."""
    lines = ["", "## Runs with a real injected slowdown, judged as shipped", "",
             "Each run made with `--flashckpt-inject` (the injection is in each result's notes), judged by the real "
             "gate against the committed baseline at the shipped settings.", "",
             "| run | injection | rows judged | regressed | ~ | ok | run fails |", "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    data["injected"] = []
    for path in paths:
        record = read_record(path)
        verdicts = _verdicts(baseline, record, metric, Thresholds())
        injection = sorted({n for r in record.results for n in r.notes if "inject" in n.lower()})
        failed = "regressed" in verdicts
        lines.append(f"| `{shown(path.parent)}` | {injection[0] if injection else '(none recorded)'} | {len(verdicts)} | "
                     f"{verdicts.count('regressed')} | {verdicts.count('~')} | {verdicts.count('ok')} | "
                     f"{'yes' if failed else 'no'} |")
        data["injected"].append({"run": shown(path.parent), "rows": len(verdicts), "failed": failed,
                                 "regressed": verdicts.count("regressed")})
    caught = sum(d["failed"] for d in data["injected"])
    return lines + ["", f"Injected runs that fail: {caught} of {len(paths)}."]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--metric", default="stall_vs_copy")
    parser.add_argument("--inject", type=float, default=0.25)
    parser.add_argument("--first", type=int, default=0,
                        help="judge each run on its first N samples only (what a run with N + 1 staged saves measures: "
                             "saves are sequential, so those are the same saves); 0: all")
    parser.add_argument("--exclude", action="append", default=[], metavar="RESULTS.json:SCENARIO",
                        help="leave one scenario of one run out (a run made while that scenario measured something "
                             "else before its saves, e.g. time lost); repeat; listed in the report")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "run-drift.md")
    parser.add_argument("--injected", type=Path, action="append", default=[], metavar="RESULTS.json",
                        help="(repeat) a run made with a real injected slowdown (--flashckpt-inject): judged at the shipped "
                             "settings, each run's regressed rows listed (the gate's real detection, beside the "
                             "scaled samples)")
    parser.add_argument("--tolerances", type=lambda text: tuple(float(t) for t in text.split(",")), default=TOLERANCES,
                        help="the tolerances the sweep tries, comma-separated fractions (default: "
                             + ",".join(f"{t:g}" for t in TOLERANCES) + ")")
    args = parser.parse_args()
    baseline = Baseline.read(args.baseline)
    records = [(shown(p.parent), read_record(p)) for p in args.results]
    excluded = set()
    for item in args.exclude:
        path, _, scenario = item.partition(".json:")  # scenario ids hold "::"
        path += ".json"
        if not scenario or Path(path) not in args.results:
            raise SystemExit(f"--exclude {item!r}: give RESULTS.json:SCENARIO with a results file named in the command")
        excluded.add((shown(Path(path).parent), scenario))
    for label, record in records:
        record.results = [r for r in record.results if (label, r.id) not in excluded]
    if args.first:
        for _, record in records:
            for result in record.results:
                if result.samples.get(args.metric):
                    result.samples[args.metric] = result.samples[args.metric][: args.first]
    by_scenario = collect(baseline, records, args.metric)
    tolerance, spread_limit = sampled_limits(args.metric, Thresholds())
    default_out = args.out.resolve() == (ROOT / "reports" / "run-drift.md").resolve()
    cmd = (f"python benchmarks/run_drift.py --baseline {shown(args.baseline)} --metric {args.metric} --inject {args.inject} "
           + (f"--first {args.first} " if args.first else "")
           + (f"--tolerances {','.join(f'{t:g}' for t in args.tolerances)} " if args.tolerances != TOLERANCES else "")
           + "".join(f"--injected {shown(p)} " for p in args.injected)
           + ("" if default_out else f"--out {shown(args.out)} ")
           + "".join(f"--exclude {shown(Path(i.partition('.json:')[0] + '.json'))}:{i.partition('.json:')[2]} "
                     for i in args.exclude)
           + " ".join(shown(p) for p in args.results))
    lines = [
        f"# Run-to-run drift of `{args.metric}` and the gate", "",
        f"Command: `{cmd}`  ",
        f"Profile: `{baseline.profile_id}`; {len(records)} runs beside the baseline's own. Shipped: tolerance "
        f"{tolerance:.0%}, spread limit {spread_limit:.0%} for `{args.metric}` (`sampled_limits`; "
        f"`Metric.run_drift` = {vocabulary.METRICS[args.metric].run_drift:.0%}), alpha {Thresholds.alpha}."
        + (f" Each run judged on its first {args.first} samples only: what a run of {args.first + 1} staged saves "
           "measures (the first, cold save is not a sample)." if args.first else "")
        + (" Left out: " + ", ".join(f"`{s}` of `{label}`" for label, s in sorted(excluded))
           + " (measured under another configuration of that scenario)." if excluded else ""), "",
        "## Run medians", "",
        "| scenario | runs | run medians (baseline's first) | spread | between-run sd / mean |",
        "| --- | ---: | --- | ---: | ---: |",
    ]
    data: dict = {"command": cmd, "profile": baseline.profile_id, "metric": args.metric, "shipped_tolerance": tolerance,
                  "shipped_spread_limit": spread_limit, "scenarios": {}}
    for name, runs in sorted(by_scenario.items()):
        medians = [statistics.median(s) for _, s in runs]
        rel_sd = statistics.stdev(medians) / statistics.mean(medians) if len(medians) > 1 else 0.0
        spread = max(medians) / min(medians) - 1
        lines.append(f"| `{name}` | {len(runs)} | {', '.join(f'{m:.3f}' for m in medians)} | {spread:.1%} | {rel_sd:.1%} |")
        data["scenarios"][name] = {"labels": [label for label, _ in runs], "medians": medians, "spread": spread,
                                   "relative_sd": rel_sd}
    lines += ["", "## Each run against the committed baseline (the real gate, shipped settings)", "",
              "| run | scenario | change vs pooled median | verdict |", "| --- | --- | ---: | --- |"]
    alarms = judged = 0
    for label, record in records:
        for row in _rows(baseline, record, args.metric, Thresholds()):
            judged += 1
            alarms += row.verdict == "regressed"
            change = f"{row.change:+.1%}" if row.change is not None else "-"
            lines.append(f"| `{label}` | `{row.scenario}` | {change} | {row.verdict} |")
    lines += ["", f"Clean runs judged regressed: {alarms} of {judged}.", ""]
    data["against_baseline"] = {"judged": judged, "regressed": alarms}
    lines += ["## Tolerance sweep (every two-run baseline from the runs, every third run judged)", "",
              f"| scenario | tolerance | choices | false alarms | unstable | detected at +{args.inject:.0%} |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    totals = {tol: {"trials": 0, "false_alarms": 0, "unstable": 0, "detected": 0} for tol in args.tolerances}
    for name, runs in sorted(by_scenario.items()):
        if len(runs) < 3:
            continue
        result = sweep([s for _, s in runs], args.metric, args.inject, args.tolerances)
        data["scenarios"][name]["sweep"] = {str(t): c for t, c in result.items()}
        for tol, c in result.items():
            for key in c:
                totals[tol][key] += c[key]
            lines.append(f"| `{name}` | {tol:.0%} | {c['trials']} | {c['false_alarms']} | {c['unstable']} | {c['detected']} |")
    lines += ["", "| all scenarios | tolerance | choices | false-alarm rate | unstable | detection rate |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for tol, c in totals.items():
        n = max(c["trials"], 1)
        lines.append(f"| | {tol:.0%} | {c['trials']} | {c['false_alarms'] / n:.1%} | {c['unstable'] / n:.1%} | "
                     f"{c['detected'] / n:.1%} |")
    data["sweep_totals"] = {str(t): c for t, c in totals.items()}
    lines += gate_per_tolerance(baseline, records, args.metric, args.inject, args.tolerances, data)
    if args.injected:
        lines += injected_runs(baseline, args.injected, args.metric, data)
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
