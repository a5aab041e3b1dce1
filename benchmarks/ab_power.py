"""How often does ``flashckpt ab`` at its shipped settings catch an injected slowdown and stall, and how often does
it flag an unchanged B? Two ways:

``python benchmarks/ab_power.py`` (seconds): from REAL per-process measurements. ``benchmarks/gate_power.py``
measured the two scenarios ``suites/ab.yaml`` runs, at the same settings (the default suite's
``activation::selective_op-sdpa-s512``, 5 rounds, and ``checkpoint::save-async``, 6 saves), each run a separate
process on one machine, interleaved: 20 unchanged runs, 20 with every step 10% slower, 20 with every save
blocking 25% longer (``reports/gate-power.json``: each run's median ``overhead`` / ``stall_vs_copy``). One such
run is exactly one A/B round of one version. A trial draws ``--rounds`` runs for A from the unchanged runs and
``--rounds`` for B (from the injected runs, or from the other unchanged runs for the no-change control), without
replacement, and judges them with the A/B gate's own rule (``ab.verdicts``, via ``judge_sampled``). Reported:
the resampled rate over ``--trials`` draws (it re-uses the same 20+20 runs, so its precision is that of 20 runs,
not of the draws) and the trials that use disjoint runs (independent: 3 per injection, 1 for no change) with
their exact counts.

``python benchmarks/ab_power.py --live --minutes 30``: the real thing, as many trials as fit:
Three versions run interleaved round by round, exactly as ``flashckpt ab`` runs them (``ab.rounds.run_rounds``:
one ``flashckpt run`` process per version per round, ``PYTHONPATH`` at the tree, order rotating): A, an unchanged B
(the same tree again: the no-change control), and a B with ``--inject step=0.10,stall=0.25`` (every strategy step
10% slower: caught on ``overhead`` of the timing scenario; every save blocking 25% longer: caught on
``stall_vs_copy`` of the save scenario; each injection touches only its own scenario's gated ratio). Every
disjoint block of ``--rounds`` rounds is one trial, judged by the A/B gate (``ab.verdicts.gate``); blocks never
share a round, so trials are independent. Writes ``reports/ab-power.md`` (command, load, every rate with its 95%
Clopper-Pearson interval) after every block, and the per-round values in ``reports/ab-power.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gate_power import clopper_pearson  # noqa: E402

from pytest_flashckpt.ab.rounds import Rounds, run_once  # noqa: E402
from pytest_flashckpt.ab.trees import Side, Tree  # noqa: E402
from pytest_flashckpt.ab.verdicts import gate  # noqa: E402
from pytest_flashckpt.baselines.regression_verdicts import Thresholds  # noqa: E402
from pytest_flashckpt.config.suites import load_suite  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
INJECT = "step=0.10,stall=0.25"
WATCH = {"overhead": "selective_op-sdpa-s512", "stall_vs_copy": "save-async"}


def one_round(tree: Tree, suite: str, work: Path, index: int) -> dict:
    """One round of A, unchanged B and injected B, the order rotating, each one ``flashckpt ab`` process."""
    versions = [("a", []), ("same", []), ("inject", ["--inject", INJECT])]
    versions = versions[index % 3:] + versions[: index % 3]
    return {name: run_once(tree, suite, work / f"r{index:02d}-{name}", extra, f"round {index + 1} {name}")
            for name, extra in versions}


def from_runs(args) -> None:
    """The resampling estimate from gate_power.py's real per-process runs (see the module docstring)."""
    import random

    from pytest_flashckpt.baselines.regression_verdicts import judge_sampled

    data = json.loads(args.runs_file.read_text())["verdicts"]
    runs = {(c, m): [r["current"] for r in rows] for c, by in data.items() for m, rows in by.items()}
    conditions = [("unchanged", m, runs[("0%", m)], None) for m in WATCH] + [
        (c, m, runs[("0%", m)], v) for (c, m), v in runs.items() if c != "0%"]
    rng = random.Random(args.seed)
    thresholds = Thresholds()
    n = args.rounds
    lines = [
        "# `flashckpt ab` power at its shipped settings",
        "",
        f"Command: `python benchmarks/ab_power.py --rounds {n} --trials {args.trials} --seed {args.seed}` (from "
        f"`{args.runs_file.relative_to(ROOT) if args.runs_file.is_relative_to(ROOT) else args.runs_file}`: real "
        "per-process runs of the two `ab` suite scenarios at their settings, measured by `benchmarks/gate_power.py`; "
        "its header has that run's command, machine and load).  ",
        f"Gate: B regressed = median of B's {n} rounds > {thresholds.timing_tolerance:.0%} above A's {n} AND one-sided "
        f"Mann-Whitney p < {thresholds.alpha} on the per-round values ({n} vs {n} can reach p = {1 / math.comb(2 * n, n):.2g}).",
        "",
        "| B | metric | runs (A pool / B pool) | resampled: regressed | disjoint trials: regressed | 95% Clopper-Pearson (disjoint) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for condition, metric, a_pool, b_pool in conditions:
        def verdict(a, b):
            return judge_sampled("ab", metric, a, b, thresholds.timing_tolerance, thresholds.alpha).verdict

        hits = 0
        for _ in range(args.trials):
            if b_pool is None:
                drawn = rng.sample(a_pool, 2 * n)
                a, b = drawn[:n], drawn[n:]
            else:
                a, b = rng.sample(a_pool, n), rng.sample(b_pool, n)
            hits += verdict(a, b) == "regressed"
        shuffled_a = rng.sample(a_pool, len(a_pool))
        if b_pool is None:
            disjoint = [(shuffled_a[i:i + n], shuffled_a[i + n:i + 2 * n]) for i in range(0, len(a_pool) - 2 * n + 1, 2 * n)]
        else:
            shuffled_b = rng.sample(b_pool, len(b_pool))
            disjoint = [(shuffled_a[i:i + n], shuffled_b[i:i + n]) for i in range(0, min(len(a_pool), len(b_pool)) - n + 1, n)]
        k = sum(verdict(a, b) == "regressed" for a, b in disjoint)
        lo, hi = clopper_pearson(k, len(disjoint))
        lines.append(f"| {condition} | `{metric}` | {len(a_pool)} / {len(b_pool or a_pool)} | {hits / args.trials:.1%} of "
                     f"{args.trials} | {k} of {len(disjoint)} | {lo:.0%}-{hi:.0%} |")
    lines += ["", "The resampled rate is the better point estimate; its uncertainty is that of the 20 runs per pool "
              "(a different 20 could move it), the disjoint trials' interval is the honest bound from independent "
              "trials alone. The live mode (`--live`) runs the A/B job itself; it was not run to completion for this "
              "report (see baselines/README.md).", ""]
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", action="store_true", help="run the A/B rounds for real (slow)")
    parser.add_argument("--trials", type=int, default=2000, help="resampled trials per condition (from-runs mode)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs-file", type=Path, default=ROOT / "reports" / "gate-power.json")
    parser.add_argument("--minutes", type=float, default=30.0, help="live mode: stop starting rounds after this long")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per trial (flashckpt ab's default)")
    parser.add_argument("--suite", default="ab")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "ab-power.md")
    args = parser.parse_args()
    if not args.live:
        return from_runs(args)
    suite = str(load_suite(args.suite).path.resolve())
    tree = Tree(Side("--a-path", str(ROOT)), ROOT, None)
    began, load_before = time.time(), os.getloadavg()[0]
    values: dict[str, list] = {"a": [], "same": [], "inject": []}
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="ab-power-") as tmp:
        index = 0
        while (time.time() - began) / 60 < args.minutes:
            got = one_round(tree, suite, Path(tmp), index)
            for name, record in got.items():
                values[name].append(record)
            loads.append(os.getloadavg()[0])
            index += 1
            print(f"round {index} done at {(time.time() - began) / 60:.1f} min, load {loads[-1]:.1f}", flush=True)
            if index % args.rounds == 0:
                write(args, values, began, load_before, loads)
    write(args, values, began, load_before, loads)


def write(args, values, began, load_before, loads) -> None:
    thresholds = Thresholds()
    n = len(values["a"]) // args.rounds
    outcome: dict[tuple[str, str], list[str]] = {}
    changes: dict[tuple[str, str], list[float]] = {}
    for t in range(n):
        block = slice(t * args.rounds, (t + 1) * args.rounds)
        for condition in ("same", "inject"):
            rows = gate(Rounds({"a": values["a"][block], "b": values[condition][block]}), thresholds).rows
            for metric, scenario in WATCH.items():
                row = next(r for r in rows if r.metric == metric and r.scenario.endswith(scenario))
                outcome.setdefault((condition, metric), []).append(row.verdict)
                changes.setdefault((condition, metric), []).append(row.change or 0.0)
    per_round = {k: [[r.metrics.get(m) for r in rec.results for m in WATCH if r.metrics.get(m) is not None] for rec in v]
                 for k, v in values.items()}
    args.out.with_suffix(".json").write_text(json.dumps({"rounds": per_round, "load1": loads}, indent=1) + "\n")
    cmd = f"python benchmarks/ab_power.py --live --minutes {args.minutes:g} --rounds {args.rounds} --suite {args.suite}"
    lines = [
        "# `flashckpt ab` power at its shipped settings",
        "",
        f"Command: `{cmd}`  ",
        f"{len(values['a'])} rounds of each version ({n} trials of {args.rounds} rounds), {(time.time() - began) / 60:.1f} "
        f"min; load average (1 min) {load_before:.1f} before, {min(loads or [0]):.1f}-{max(loads or [0]):.1f} during, on "
        f"{os.cpu_count()} CPUs shared with other work (a loaded machine).  ",
        f"Gate: regressed = median of B's rounds > {thresholds.timing_tolerance:.0%} above A's AND one-sided Mann-Whitney "
        f"p < {thresholds.alpha} on the per-round values. Injected B: `--inject {INJECT}`.",
        "",
        "| B | metric (scenario) | trials | regressed | rate | 95% Clopper-Pearson | median change | verdicts |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (condition, metric), words in sorted(outcome.items()):
        k = sum(w == "regressed" for w in words)
        lo, hi = clopper_pearson(k, len(words))
        ch = sorted(changes[(condition, metric)])[len(words) // 2]
        name = "unchanged" if condition == "same" else "step +10%, stall +25%"
        lines.append(f"| {name} | `{metric}` (`{WATCH[metric]}`) | {len(words)} | {k} | {k / len(words):.0%} | "
                     f"{lo:.0%}-{hi:.0%} | {ch:+.1%} | {', '.join(words)} |")
    if not outcome:
        lines.append("| — | — | 0 | — | — | — | — | no complete trial yet |")
    lines.append("")
    args.out.write_text("\n".join(lines), encoding="utf-8")


if __name__ == "__main__":
    main()
