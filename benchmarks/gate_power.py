"""Can the gate fail at the settings the suites ship? Run: ``python benchmarks/gate_power.py`` (~10 min quiet).

Measures, at the SHIPPED suite settings (the scenario's rounds, steps, saves as the default suite runs them, against a
baseline recorded the way ``baselines/README.md`` says: ``--flashckpt-rounds=20 --flashckpt-saves=12``):

- **step-time detection**: a shipped timing scenario (default ``activation::selective_op-sdpa-s512``) re-run with an
  injected 10% slowdown of its strategy's steps (``--flashckpt-inject step=0.10``: a sleep of 10% of each step's
  own duration, see ``pytest_flashckpt/config/injection.py``) and judged on ``overhead``;
- **save-stall detection**: a shipped save scenario (default ``checkpoint::save-async``) re-run with every save
  blocking 25% longer (``stall=0.25``) and judged on ``stall_vs_copy`` (each save's stall over a staging copy of the same state timed just before it);
- **false alarms**: both re-run unchanged (0%), judged on both metrics.

Each condition runs ``--runs`` times (>= 20), interleaved (0%, step, stall, 0%, ...) so slow drifts of the machine
hit all three alike; each run is judged by the real gate (``baselines.regression_verdicts.compare_scenario``) against a
baseline measured in a separate process, as a CI run is judged against a committed baseline. Each run is a fresh
``RunContext`` (a new reference, as in a new suite run). The rates are reported with exact Clopper-Pearson and
Wilson 95% intervals; the targets: detection >= 90%, at most 1 false alarm in 20 (on a quiet machine).

Writes ``reports/gate-power.md`` (and the raw verdicts beside it, ``.json``), with the command and load averages.
``--runs 3`` is a smoke run (~2 min quiet).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from pytest_flashckpt.baselines.entry import BaselineEntry
from pytest_flashckpt.baselines.gate import first_look
from pytest_flashckpt.baselines.stats import smallest_p
from pytest_flashckpt.baselines.store import Baseline, entry
from pytest_flashckpt.baselines.regression_verdicts import Thresholds, compare_scenario, sampled_limits
from pytest_flashckpt.config.scenario import Scenario
from pytest_flashckpt.config.suites import load_suite
from pytest_flashckpt.config.injection import Injection
from pytest_flashckpt.runner.context import RunContext
from pytest_flashckpt.runner.run import run_scenario

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
BASELINE_ROUNDS = 20  # = baselines/README.md's recipe
BASELINE_SAVES = 12
STALL = "stall_vs_copy"  # the gated stall ratio (pytest_flashckpt/core/metrics.py)


# -- binomial confidence intervals (95%) -------------------------------------------------------------------------
def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _binom_cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def clopper_pearson(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval, by bisection on the binomial CDF (no scipy needed)."""

    def root(f, target: float, increasing: bool) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if (f(mid) < target) == increasing:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    lower = 0.0 if k == 0 else root(lambda p: 1 - _binom_cdf(k - 1, n, p), alpha / 2, increasing=True)
    upper = 1.0 if k == n else root(lambda p: _binom_cdf(k, n, p), alpha / 2, increasing=False)
    return lower, upper


# -- runs ----------------------------------------------------------------------------------------------------------
def find(scenario_id: str, suite: str) -> Scenario:
    for scenario in load_suite(suite).scenarios:
        if f"{scenario.suite}::{scenario.name}" == scenario_id:
            return scenario
    raise SystemExit(f"no scenario {scenario_id!r} in suite {suite!r}; name one as suite::name")


def shipped(scenario: Scenario, metric: str) -> Scenario:
    """The scenario as the suite ships it, measuring only what the gated metric needs (the exact memory and FLOP
    counts do not enter a timing verdict and would only make each run longer)."""
    if metric == "overhead":
        return dataclasses.replace(scenario, measure=("timing",))
    # the time lost per save (K steps with and without a save) does not enter the stall verdict either
    return dataclasses.replace(scenario, measure=("checkpoint",), save=dataclasses.replace(scenario.save, time_lost_rounds=0))


def for_baseline(scenario: Scenario) -> Scenario:
    save = scenario.save
    if save.strategy != "none":
        save = dataclasses.replace(save, saves=BASELINE_SAVES)
    return dataclasses.replace(scenario, rounds=BASELINE_ROUNDS, save=save)


def measure(scenario: Scenario, injection: Injection | None, workdir: Path | None,
            confirm: tuple[BaselineEntry, Thresholds, int] | None = None):
    """One run of ``scenario`` in a fresh context; ``confirm`` (the stored entry, the thresholds, the rounds to add):
    confirmation rounds as a suite run adds them (``SuiteRun.confirmation_rounds``, through the same
    ``baselines.gate.first_look``)."""
    ctx = RunContext(device=CPU, probe="cpu", workdir=workdir, inject=injection)
    if confirm is not None and confirm[2] > 0:
        stored, thresholds, rounds = confirm
        ctx.more_rounds = lambda result, samples: rounds if first_look(stored, result, "overhead", samples, thresholds) else 0
    result = run_scenario(scenario, ctx)
    if result.status != "measured":
        raise SystemExit(f"{result.id}: {result.status}: {result.reason}\n{''.join(result.notes[-1:])}")
    return result


def baseline_run(args) -> None:
    """The separate process: print the baseline entries of both scenarios as JSON (what a baseline file keeps)."""
    out = {}
    for scenario_id, metric in ((args.timing_scenario, "overhead"), (args.stall_scenario, STALL)):
        result = measure(for_baseline(shipped(find(scenario_id, args.suite), metric)), None, args.workdir)
        out[scenario_id] = entry(result, None, "gate-power").to_dict()
    print(json.dumps(out))


def judge(result, stored: BaselineEntry, metric: str, thresholds: Thresholds) -> dict:
    rows, _ = compare_scenario(result.id, stored, result.metrics, result.samples, result.probe, thresholds)
    row = next((r for r in rows if r.metric == metric), None)
    if row is None:
        raise SystemExit(f"{result.id}: the gate produced no {metric} verdict; metrics: {sorted(result.metrics)}")
    out = row.to_dict()
    out["confirmation_rounds"] = int(result.metrics.get("confirmation_rounds", 0) or 0)
    out["samples"] = result.samples.get(metric)  # per round / per save: what later analyses resample
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per condition (>= 20 for the README's figures)")
    parser.add_argument("--suite", default="default", help="the suite whose settings are measured")
    parser.add_argument("--timing-scenario", default="activation::selective_op-sdpa-s512")
    parser.add_argument("--stall-scenario", default="checkpoint::save-async")
    parser.add_argument("--confirm-rounds", type=int, default=5,
                        help="confirmation rounds added to a timing run whose first look reads slower (as "
                             "--flashckpt-confirm-rounds; 0: the first look alone is judged)")
    parser.add_argument("--slowdown", type=float, default=0.10)
    parser.add_argument("--stall", type=float, default=0.25)
    parser.add_argument("--out", default=str(ROOT / "reports" / "gate-power.md"), help="markdown report; raw verdicts beside it (.json)")
    parser.add_argument("--workdir", type=Path, default=None, help="folder for temporary checkpoints")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="judge against this stored baseline file (e.g. the committed, pooled one) instead of a "
                             "baseline measured in a separate process first: the 'another host' check")
    parser.add_argument("--host", default="", help="what stands in for another host here (recorded in the report)")
    parser.add_argument("--baseline-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--render", action="store_true",
                        help="re-render the markdown from the raw verdicts beside it (.json), measuring nothing")
    args = parser.parse_args()
    if args.baseline_only:
        return baseline_run(args)
    if args.render:
        return render(args)

    thresholds = Thresholds()
    began, load_before = time.time(), os.getloadavg()
    if args.baseline is not None:
        stored = Baseline.read(args.baseline).scenarios
        missing = [s for s in (args.timing_scenario, args.stall_scenario) if s not in stored]
        if missing:
            raise SystemExit(f"{args.baseline}: no entry for {', '.join(missing)}")
        baseline = {s: stored[s] for s in (args.timing_scenario, args.stall_scenario)}
    else:
        cmd = [sys.executable, __file__, "--baseline-only", f"--suite={args.suite}", f"--timing-scenario={args.timing_scenario}",
               f"--stall-scenario={args.stall_scenario}"] + ([f"--workdir={args.workdir}"] if args.workdir else [])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"baseline run failed:\n{proc.stderr[-4000:]}")
        baseline = {k: BaselineEntry.from_dict(e) for k, e in json.loads(proc.stdout.strip().splitlines()[-1]).items()}

    timing = shipped(find(args.timing_scenario, args.suite), "overhead")
    stall = shipped(find(args.stall_scenario, args.suite), STALL)
    conditions = {
        "0%": [(timing, "overhead", None), (stall, STALL, None)],
        f"step +{args.slowdown:.0%}": [(timing, "overhead", Injection(step=args.slowdown))],
        f"stall +{args.stall:.0%}": [(stall, STALL, Injection(stall=args.stall))],
    }
    verdicts: dict[str, dict[str, list[dict]]] = {c: {} for c in conditions}
    names = list(conditions)
    for run in range(args.runs):
        order = names[run % len(names):] + names[: run % len(names)]
        for condition in order:
            for scenario, metric, injection in conditions[condition]:
                stored = baseline[f"{scenario.suite}::{scenario.name}"]
                confirm = (stored, thresholds, args.confirm_rounds) if metric == "overhead" else None
                result = measure(scenario, injection, args.workdir, confirm)
                row = judge(result, stored, metric, thresholds)
                row["load1"] = os.getloadavg()[0]
                verdicts[condition].setdefault(metric, []).append(row)
        print(f"run {run + 1}/{args.runs}: " + "; ".join(
            f"{c} {m}: {rows[-1]['verdict']} ({(rows[-1]['change'] or 0):+.1%})" for c in names for m, rows in verdicts[c].items()
        ), flush=True)
        # written after every run: a run stopped early still leaves its report (with the runs it has)
        elapsed, load_after = time.time() - began, os.getloadavg()
        write_report(Path(args.out), args, timing, stall, baseline, verdicts, thresholds, elapsed, load_before, load_after, run + 1)
        meta = {"elapsed_s": elapsed, "load_before": list(load_before), "load_after": list(load_after), "runs_done": run + 1}
        Path(args.out).with_suffix(".json").write_text(json.dumps({"baseline": {k: e.to_dict() for k, e in baseline.items()}, "verdicts": verdicts, "meta": meta}, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


def render(args) -> None:
    """The report again from the raw verdicts of a finished run (``--render``): same arguments, nothing measured."""
    raw = json.loads(Path(args.out).with_suffix(".json").read_text(encoding="utf-8"))
    baseline = {k: BaselineEntry.from_dict(e) for k, e in raw["baseline"].items()}
    meta = raw["meta"]
    timing = shipped(find(args.timing_scenario, args.suite), "overhead")
    stall = shipped(find(args.stall_scenario, args.suite), STALL)
    write_report(Path(args.out), args, timing, stall, baseline, raw["verdicts"], Thresholds(), meta["elapsed_s"],
                 tuple(meta["load_before"]), tuple(meta["load_after"]), meta["runs_done"])
    print(f"wrote {args.out}")


def summarise(rows: list[dict]) -> dict:
    n = len(rows)
    k = sum(r["verdict"] == "regressed" for r in rows)
    return {
        "n": n, "flagged": k, "rate": k / n if n else 0.0, "wilson": wilson(k, n), "cp": clopper_pearson(k, n),
        "noise": sum(r["verdict"] == "~" for r in rows),
        "unstable": sum(r["verdict"] == "unstable" for r in rows),
        "median_change": statistics.median(r["change"] for r in rows if r["change"] is not None) if rows else None,
    }


def standin_prefix() -> str:
    """The environment a stand-in host ran under, as a command prefix (what a reader must type to repeat it)."""
    cpus = sorted(os.sched_getaffinity(0))
    pinned = f"taskset -c {','.join(map(str, cpus))} " if len(cpus) < (os.cpu_count() or 1) else ""
    threads = f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} " if "OMP_NUM_THREADS" in os.environ else ""
    return threads + pinned


def shown(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def describe_runs(stored: BaselineEntry, metric: str) -> str:
    runs = [r.samples[metric] for r in stored.runs if r.samples.get(metric)]
    if len(runs) < 2:
        return f"{metric}: one run"
    medians = [statistics.median(r) for r in runs]
    return (f"{metric}: {len(runs)} runs, medians {', '.join(f'{m:.3f}' for m in medians)}, spread "
            f"{max(medians) / min(medians) - 1:.1%}")


def first_looks_alone(verdicts, stored: BaselineEntry, thresholds: Thresholds, rounds: int) -> dict[str, tuple[int, int]]:
    """Per condition: how many timing runs the gate flags on their first ``rounds`` rounds alone, of the runs whose
    per-round samples were kept: the same runs, judged as a gate without confirmation rounds would."""
    out = {}
    for condition, by_metric in verdicts.items():
        rows = [r for r in by_metric.get("overhead", []) if r.get("samples")]
        if not rows:
            continue
        flagged = 0
        for r in rows:
            first = r["samples"][:rounds]
            judged, _ = compare_scenario(r["scenario"], stored, {"overhead": statistics.median(first)}, {"overhead": first},
                                         "cpu", thresholds)
            flagged += any(j.metric == "overhead" and j.verdict == "regressed" for j in judged)
        out[condition] = (flagged, len(rows))
    return out


def write_report(out: Path, args, timing, stall, baseline, verdicts, thresholds, elapsed, load_before, load_after, done: int) -> None:
    t_id, s_id = f"{timing.suite}::{timing.name}", f"{stall.suite}::{stall.name}"
    t_base, s_base = baseline[t_id].samples["overhead"], baseline[s_id].samples[STALL]
    rounds, saves = timing.rounds, stall.save.saves
    load_line = (
        f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f} on {os.cpu_count()} CPUs"
        # the benchmark itself keeps its torch threads busy: a load above that (plus one) means other work ran too
        + (" (other work shared the machine: these are loaded-machine numbers)"
           if max(load_before[0], load_after[0]) > torch.get_num_threads() + 1 else " (about this benchmark's own threads)")
    )
    lines = [
        "# Gate power at the shipped settings",
        "",
        *([] if done == args.runs else [f"**Partial: {done} of {args.runs} runs** (the report is rewritten after every run).", ""]),
        f"Command: `{standin_prefix()}python benchmarks/gate_power.py --runs {args.runs} --suite {args.suite} --timing-scenario {t_id} "
        f"--stall-scenario {s_id} --confirm-rounds {args.confirm_rounds}"
        + (f" --baseline {shown(args.baseline)}" if args.baseline else "")
        + (f" --workdir {args.workdir}" if args.workdir else "")
        + (f" --host '{args.host}'" if args.host else "") + "`  ",
        *([f"Host: {args.host} (this process: CPUs {sorted(os.sched_getaffinity(0))}, torch threads "
           f"{torch.get_num_threads()}, checkpoints in {args.workdir or 'the system temp folder'}).  "] if args.host else []),
        *([f"Baseline: `{shown(args.baseline)}` (stored; {describe_runs(baseline[t_id], 'overhead')}; "
           f"{describe_runs(baseline[s_id], STALL)}).  "] if args.baseline else []),
        f"Machine: torch {torch.__version__}, {torch.get_num_threads()} threads; {load_line}; {elapsed / 60:.1f} min.  ",
        f"Gate: regressed = median change > {sampled_limits('overhead', thresholds)[0]:.0%} (overhead), "
        f"{sampled_limits(STALL, thresholds)[0]:.0%} ({STALL}, its run-to-run drift) AND one-sided Mann-Whitney p < "
        f"{thresholds.alpha} (`pytest_flashckpt/baselines/regression_verdicts.py`).  ",
        f"Step time: `{t_id}` as shipped ({rounds} interleaved rounds x {timing.steps} step(s), seq {timing.seq_len}, batch "
        f"{timing.batch_size}, and {args.confirm_rounds} confirmation rounds when those read slower than the baseline) vs a "
        f"{len(t_base)}-round baseline (median overhead {statistics.median(t_base):.3f}, range "
        f"{min(t_base):.3f}-{max(t_base):.3f}); smallest reachable p {smallest_p(rounds, len(t_base)):.2g} on the first look, "
        f"{smallest_p(rounds + args.confirm_rounds, len(t_base)):.2g} with the confirmation rounds.  ",
        f"Save stall: `{s_id}` as shipped ({saves} saves) vs a {len(s_base)}-save baseline (median stall_vs_copy "
        f"{statistics.median(s_base):.3f}, range {min(s_base):.3f}-{max(s_base):.3f}); smallest reachable p "
        f"{smallest_p(saves, len(s_base)):.2g}.",
        "",
        "| injected | metric | runs | flagged regressed | rate | 95% Clopper-Pearson | 95% Wilson | median change | ~ (not enough evidence) | unstable |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    summary = {}
    for condition, by_metric in verdicts.items():
        for metric, rows in by_metric.items():
            s = summarise(rows)
            summary[(condition, metric)] = s
            mc = "—" if s["median_change"] is None else f"{s['median_change']:+.1%}"
            lines.append(
                f"| {condition} | `{metric}` | {s['n']} | {s['flagged']} | {s['rate']:.0%} | {s['cp'][0]:.0%}-{s['cp'][1]:.0%} | "
                f"{s['wilson'][0]:.0%}-{s['wilson'][1]:.0%} | {mc} | {s['noise']} | {s['unstable']} |"
            )
    step = summary[(f"step +{args.slowdown:.0%}", "overhead")]
    stall_s = summary[(f"stall +{args.stall:.0%}", STALL)]
    false = [summary[("0%", m)] for m in ("overhead", STALL)]
    lines += [
        "",
        f"Detection: step +{args.slowdown:.0%} {step['flagged']}/{step['n']} ({step['rate']:.0%}, 95% CI {step['cp'][0]:.0%}-{step['cp'][1]:.0%}); "
        f"stall +{args.stall:.0%} {stall_s['flagged']}/{stall_s['n']} ({stall_s['rate']:.0%}, 95% CI {stall_s['cp'][0]:.0%}-{stall_s['cp'][1]:.0%}). "
        f"False alarms: overhead {false[0]['flagged']}/{false[0]['n']}, stall_vs_copy {false[1]['flagged']}/{false[1]['n']}. "
        f"Targets (quiet machine): detection >= 90%, <= 1 false alarm in 20.",
        "",
        "Confirmation rounds (timing runs that added them / runs): "
        + "; ".join(f"{c} {sum(1 for r in by['overhead'] if r.get('confirmation_rounds'))}/{len(by['overhead'])}"
                    for c, by in verdicts.items() if "overhead" in by) + ".",
        "",
        f"The same runs judged on their first {rounds} rounds alone (the gate without confirmation rounds, from the "
        "samples above): "
        + "; ".join(f"{c} regressed {k}/{n}" for c, (k, n) in first_looks_alone(verdicts, baseline[t_id], thresholds, rounds).items())
        + ".",
        "",
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines), encoding="utf-8")


if __name__ == "__main__":
    main()
