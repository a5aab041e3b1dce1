"""Budget sweep: the ``budget`` strategy from the smallest achievable peak to the no-checkpointing peak, beside
the fixed strategies, measured in one run. Writes ``reports/budget-sweep.{md,json,png}``.

    .venv/bin/python benchmarks/budget_sweep.py                      # tiny, batch 4 x 256, 10 points, 10 rounds
    .venv/bin/python benchmarks/budget_sweep.py --card small --seq 256 --rounds 5 --out reports/budget-sweep-small

Every number comes from this run: peaks from the exact ``cpu`` probe on a real training step (after a warm-up
step, so AdamW's state is resident), FLOPs from ``FlopCounterMode`` (``activation.flops``), step-time ratios
from interleaved rounds against the no-checkpointing reference (median of per-round ratios). Targets (issue 15)
are evaluated and printed, not asserted: measured peak <= budget at every point and >= 95% of it; peak monotone in
the budget; FLOP ratio no worse than the best fixed strategy that fits, strictly better at >= 2 points.

Step time against the fixed strategies is measured side by side: each point's plan and the fastest fitting fixed
strategy run interleaved round by round (``--rounds``), and a one-sided Mann-Whitney test on the per-round step
times (``baselines.stats``, alpha ``ALPHA``) says whether the plan is slower (``worse``), faster (``better``) or
neither (``tie``: the rounds cannot tell them apart). "No worse" counts better + tie.
Costs come from ``SimulatedCosts`` for a CPU target by default (byte-equal to the measured ones,
``tests/simulate/test_simulated_costs.py``, and ~25x faster); ``--costs measured`` uses ``MeasuredCosts``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from pytest_flashckpt.activation import apply_ac, apply_budget
from pytest_flashckpt.activation.budget import MeasuredCosts, min_peak
from pytest_flashckpt.baselines.stats import mann_whitney_greater
from pytest_flashckpt.activation.flops import count_step_flops
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.probes.cpu import LiveTensorProbe
from pytest_flashckpt.runner.timing import interleaved
from pytest_flashckpt.training import Trainer

FIXED = (("none", {}), ("full", {}), ("every_k", {"k": 2}), ("selective_op", {}))
ALPHA = 0.05  # one-sided, per point: the sweep reports each comparison, it does not gate a run


def peak(trainer: Trainer) -> int:
    with LiveTensorProbe().track(trainer.state_tensors()) as reading:
        trainer.train_step()
    return reading.peak_bytes


def measure(trainer: Trainer, reference: Trainer, ref_flops: int, rounds: int) -> dict:
    trainer.train_step()  # warm-up: optimizer state exists
    out = {"peak_bytes": peak(trainer), "flop_ratio": count_step_flops(trainer) / ref_flops}
    times = interleaved([reference.train_step, trainer.train_step], rounds, 1, torch.device("cpu"))
    out["time_ratio"] = statistics.median(s / r for s, r in zip(times[1], times[0]))
    out["time_ratio_range"] = [min(s / r for s, r in zip(times[1], times[0])), max(s / r for s, r in zip(times[1], times[0]))]
    out["step_time_s"] = statistics.median(times[1])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--card", default="tiny")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--backend", default="sdpa", choices=["sdpa", "eager"])
    parser.add_argument("--dropout", type=float, default=None, help="override the card's dropout")
    parser.add_argument("--points", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10, help="interleaved timing rounds per point and per fixed strategy")
    parser.add_argument("--costs", default="simulated", choices=["simulated", "measured"], help="the planner's cost source (byte-equal; simulated is faster)")
    parser.add_argument("--out", default="reports/budget-sweep", help="path prefix of the .md, .json and .png")
    parser.add_argument("--render", action="store_true", help="only re-render the .md and .png from the .json at --out")
    args = parser.parse_args(argv)
    if args.render:
        out = Path(args.out)
        record = json.loads(out.with_suffix(".json").read_text())
        plot(record, out.with_suffix(".png"))
        out.with_suffix(".md").write_text(markdown(record, out.with_suffix(".png").name))
        return 0

    overrides = {} if args.dropout is None else {"dropout": args.dropout}
    config = load_card(args.card, **overrides)
    shape = (args.batch, args.seq)

    def fresh():
        return build_model(config, args.backend)

    start = time.perf_counter()
    if args.costs == "simulated":
        from pytest_flashckpt.simulate.costs import SimulatedCosts

        source = SimulatedCosts(config, "float32", args.backend, "cpu")
    else:
        source = MeasuredCosts.shared(fresh())
    costs = source.costs(*shape)
    lowest = min_peak(costs)
    none_peak = costs.none_peak()
    print(f"costs measured in {costs.seconds:.1f} s; min peak {lowest.predicted_peak:,} B, none {none_peak:,} B", flush=True)

    reference = Trainer.create(fresh(), *shape)
    reference.train_step()
    ref_flops = count_step_flops(reference)

    fixed, fixed_trainers = [], {}
    for name, extra in FIXED:
        model = fresh()
        apply_ac(model, ActivationConfig(strategy=name, **extra))
        label = name if name != "every_k" else "every_k(2)"
        fixed_trainers[label] = Trainer.create(model, *shape)
        row = {"strategy": label, **measure(fixed_trainers[label], reference, ref_flops, args.rounds)}
        fixed.append(row)
        print(row, flush=True)

    points = []
    for k in range(args.points):
        span = k / (args.points - 1)
        model = fresh()
        applied = apply_budget(model, f"min + {span * 100:.6f}%", shape, source=source)
        shape_plan = applied.plans[shape]
        row = {
            "span": span,
            "budget_bytes": shape_plan.budget_bytes,
            "predicted_peak_bytes": shape_plan.plan.predicted_peak,
            "plan": list(shape_plan.options),
            "solve_s": shape_plan.plan.seconds,
            "exact": shape_plan.plan.exact,
        }
        plan_trainer = Trainer.create(model, *shape)
        row.update(measure(plan_trainer, reference, ref_flops, args.rounds))
        fits = [f for f in fixed if f["peak_bytes"] <= row["budget_bytes"]]
        best = min(fits, key=lambda f: f["flop_ratio"]) if fits else None
        row["best_fixed"] = best["strategy"] if best else None
        row["best_fixed_flop_ratio"] = best["flop_ratio"] if best else None
        if fits:
            # the fastest fitting fixed strategy (by its own rounds), re-timed side by side with this plan
            fastest = min(fits, key=lambda f: f["time_ratio"])
            plan_s, fixed_s = interleaved([plan_trainer.train_step, fixed_trainers[fastest["strategy"]].train_step],
                                          args.rounds, 1, torch.device("cpu"))
            row.update(versus_fixed(fastest["strategy"], plan_s, fixed_s))
        points.append(row)
        print({k: v for k, v in row.items() if k != "plan"}, flush=True)

    targets = evaluate(points)
    record = {
        "card": config.name, "batch_size": args.batch, "seq_len": args.seq, "backend": args.backend,
        "dropout": config.dropout, "rounds": args.rounds, "costs": args.costs, "torch": torch.__version__, "machine": platform.platform(),
        "measure_costs_s": costs.seconds, "pointwise_weight": costs.pointwise_weight,
        "pointwise_weight_source": "fixed model, activation.budget.costs.pointwise_weight_for",
        "min_peak_bytes": lowest.predicted_peak, "none_peak_bytes": none_peak, "options": [o.name for o in costs.options],
        "fixed": fixed, "points": points, "targets": targets, "wall_s": time.perf_counter() - start,
        "command": "python benchmarks/budget_sweep.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    plot(record, out.with_suffix(".png"))
    out.with_suffix(".md").write_text(markdown(record, out.with_suffix(".png").name))
    print(json.dumps(targets, indent=2))
    return 0


def versus_fixed(strategy: str, plan_s: list[float], fixed_s: list[float]) -> dict:
    """The plan against the fastest fitting fixed strategy, timed in the same interleaved rounds."""
    p_slower, p_faster = mann_whitney_greater(plan_s, fixed_s), mann_whitney_greater(fixed_s, plan_s)
    verdict = "worse" if p_slower < ALPHA else "better" if p_faster < ALPHA else "tie"
    return {
        "vs_fixed": strategy, "vs_fixed_ratio": statistics.median(p / f for p, f in zip(plan_s, fixed_s)),
        "vs_fixed_p_slower": p_slower, "vs_fixed_p_faster": p_faster, "vs_fixed_verdict": verdict,
    }


def evaluate(points: list[dict]) -> dict:
    under = [p["peak_bytes"] <= p["budget_bytes"] for p in points]
    close = [p["peak_bytes"] >= 0.95 * p["budget_bytes"] for p in points]
    peaks = [p["peak_bytes"] for p in points]
    compared = [p for p in points if p["best_fixed_flop_ratio"] is not None]
    no_worse = [p["flop_ratio"] <= p["best_fixed_flop_ratio"] * (1 + 1e-9) for p in compared]
    better = [p["flop_ratio"] < p["best_fixed_flop_ratio"] * (1 - 1e-9) for p in compared]
    timed = [p for p in compared if "vs_fixed_verdict" in p]
    time_no_worse = [p["vs_fixed_verdict"] != "worse" for p in timed]
    time_better = [p["vs_fixed_verdict"] == "better" for p in timed]
    return {
        "peak_under_budget": f"{sum(under)}/{len(points)}",
        "peak_within_5pct_below_budget": f"{sum(close)}/{len(points)}",
        "peak_monotone_in_budget": all(a <= b for a, b in zip(peaks, peaks[1:])),
        "flop_ratio_no_worse_than_best_fitting_fixed": f"{sum(no_worse)}/{len(compared)}",
        "flop_ratio_strictly_better": f"{sum(better)}/{len(compared)}",
        "time_no_worse_than_fastest_fitting_fixed_side_by_side": f"{sum(time_no_worse)}/{len(timed)}",
        "time_strictly_better_side_by_side": f"{sum(time_better)}/{len(timed)}",
        "points_without_a_fitting_fixed_strategy": len(points) - len(compared),
        "solve_s_max": max(p["solve_s"] for p in points),
    }


def _versus(p: dict) -> str:
    if "vs_fixed_verdict" not in p:
        return "—"
    p_value = p["vs_fixed_p_slower"] if p["vs_fixed_verdict"] == "worse" else p["vs_fixed_p_faster"]
    return f"{p['vs_fixed_ratio']:.3f}x vs {p['vs_fixed']}: {p['vs_fixed_verdict']} (p {p_value:.3g})"


def mib(value: float) -> str:
    return f"{value / 2**20:,.2f}"


def markdown(r: dict, png: str) -> str:
    lines = [
        f"# Budget sweep: {r['card']}, batch {r['batch_size']} x {r['seq_len']}, {r['backend']}, dropout {r['dropout']}",
        "",
        f"Command: `{r['command']}` (torch {r['torch']}, {r['machine']}; {r['rounds']} interleaved timing rounds;"
        f" wall {r['wall_s']:.0f} s). Peaks: exact `cpu` probe on a real training step. Costs measured in"
        f" {r['measure_costs_s']:.1f} s ({len(r['options'])} options x 1 step, {r.get('costs', 'measured')}); pointwise weight"
        f" {r['pointwise_weight']:.0f} FLOP-equivalents per element ({r.get('pointwise_weight_source', 'measured')}).",
        "",
        f"Smallest achievable peak: {mib(r['min_peak_bytes'])} MiB; no checkpointing: {mib(r['none_peak_bytes'])} MiB.",
        "",
        "| budget (MiB) | predicted peak | measured peak | peak / budget | FLOP ratio | time ratio (min-max) | best fixed that fits (FLOP ratio) | plan / fastest fitting fixed, same rounds | plan (per block) | solve |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in r["points"]:
        best = f"{p['best_fixed']} ({p['best_fixed_flop_ratio']:.3f}x)" if p["best_fixed"] else "none fits"
        lo, hi = p["time_ratio_range"]
        lines.append(
            f"| {mib(p['budget_bytes'])} | {mib(p['predicted_peak_bytes'])} | {mib(p['peak_bytes'])} | "
            f"{p['peak_bytes'] / p['budget_bytes']:.3f} | {p['flop_ratio']:.3f}x | {p['time_ratio']:.3f}x ({lo:.2f}-{hi:.2f}) | "
            f"{best} | {_versus(p)} | {', '.join(p['plan'])} | {p['solve_s'] * 1e3:.1f} ms{'' if p['exact'] else ' (fallback)'} |"
        )
    lines += ["", "Fixed strategies at the same shape:", "", "| strategy | measured peak (MiB) | FLOP ratio | time ratio (min-max) |", "|---|---|---|---|"]
    for f in r["fixed"]:
        lo, hi = f["time_ratio_range"]
        lines.append(f"| {f['strategy']} | {mib(f['peak_bytes'])} | {f['flop_ratio']:.3f}x | {f['time_ratio']:.3f}x ({lo:.2f}-{hi:.2f}) |")
    lines += [
        "",
        "How to read it: the FLOP ratio counts matmul and attention FLOPs only; the planner's objective also charges"
        " recomputed pointwise elements at the measured weight above, which the FLOP ratio cannot show (a plan that"
        " saves every matmul output reads 1.000x but still recomputes LayerNorm, GeLU and adds). Step-time ratios"
        " are medians of interleaved rounds; where a row's min-max spread is wider than the differences between"
        " rows (or a ratio is below 1 for a strategy that only adds work), the machine was too busy for timing"
        " to separate the strategies: rerun on a quiet machine with more rounds.",
        "",
        "Targets (issue 15), evaluated on the numbers above:",
        "",
    ]
    lines += [f"- {key.replace('_', ' ')}: {value}" for key, value in r["targets"].items()]
    lines += ["", f"![peak vs overhead]({png})", ""]
    return "\n".join(lines)


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, key, label in ((axes[0], "flop_ratio", "FLOP ratio (step / no checkpointing)"), (axes[1], "time_ratio", "step-time ratio (median of rounds)")):
        xs = [p["peak_bytes"] / 2**20 for p in r["points"]]
        ax.plot(xs, [p[key] for p in r["points"]], "o-", label="budget (10 budgets)")
        for f in r["fixed"]:
            ax.plot(f["peak_bytes"] / 2**20, f[key], "s", markersize=8, label=f["strategy"])
            ax.annotate(f["strategy"], (f["peak_bytes"] / 2**20, f[key]), textcoords="offset points", xytext=(5, 5), fontsize=8)
        for p in r["points"]:
            ax.axvline(p["budget_bytes"] / 2**20, color="grey", alpha=0.15, linewidth=0.8)
        ax.set_xlabel("measured peak (MiB); grey lines: budgets")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"budget sweep: {r['card']} b{r['batch_size']}xs{r['seq_len']} ({r['backend']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
