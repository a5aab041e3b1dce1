"""Planning speed of the ``budget`` strategy: costs for one input shape plus the exact solve, per card. Writes
``reports/budget-plan-speed.md``.

    .venv/bin/python benchmarks/budget_plan_speed.py

Rows: tiny and small with costs measured on this CPU (``MeasuredCosts``: one real step per block option under the
exact probe, the pointwise weight timed here), and gpt3-2.7b with costs simulated on ``meta`` for CUDA's flash
kernel in bf16 (``SimulatedCosts``) at the simulate suite's shape (batch 8 x 2048) and the GPU suite's large row
(batch 1 x 2048). tiny and small are also planned from costs simulated for a CPU target (``SimulatedCosts(...,
target="cpu")``), which equal the measured ones to the byte (``tests/simulate/test_simulated_costs.py``, and
checked again here) without running the real steps' arithmetic. Each row is a fresh cost source planning its first shape: building the source, its costs, the
smallest achievable peak and the solve at ``min + 50%``; the CPU rows share one pointwise weight, timed first
(so the measured and simulated rows must plan alike, which the run checks); wall and process CPU seconds are both shown (the CPU
time is what planning costs on a machine that other work shares). The process is warmed first by planning a
one-block model (imports, first-call dispatch setup), untimed. Targets (issue 15): under 1 s for tiny/small, under
10 s for gpt3-2.7b simulated; evaluated and printed, not asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

from pytest_flashckpt.activation.budget import BudgetSpec, MeasuredCosts, min_peak, solve
from pytest_flashckpt.activation.budget.costs import measure_pointwise_weight
from pytest_flashckpt.models import GPTConfig
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.simulate.costs import SimulatedCosts

ROWS = (
    # card, batch, seq, source, target seconds
    ("tiny", 4, 256, "measured", 1.0),
    ("small", 4, 256, "measured", 1.0),
    ("tiny", 4, 256, "simulated-cpu", 1.0),
    ("small", 4, 256, "simulated-cpu", 1.0),
    ("gpt3-2.7b", 8, 2048, "simulated", 10.0),
    ("gpt3-2.7b", 1, 2048, "simulated", 10.0),
)
BUDGET = "min + 50%"


def make_source(card: str, kind: str, weight: float):
    if kind == "measured":
        return MeasuredCosts(build_model(load_card(card), "sdpa", "cpu", torch.float32), pointwise_weight=weight)
    if kind == "simulated-cpu":  # the same costs to the byte (tests/simulate/test_simulated_costs.py), no real compute
        return SimulatedCosts(card, "float32", "sdpa", "cpu", pointwise_weight=weight)
    return SimulatedCosts(card, "bfloat16", "flash", "cuda")


class Clock:
    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def lap(self) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        out = (wall - self.wall, cpu - self.cpu)
        self.wall, self.cpu = wall, cpu
        return out


def plan(card: str, batch: int, seq: int, kind: str, weight: float) -> dict:
    clock = Clock()
    source = make_source(card, kind, weight)
    build = clock.lap()
    costs = source.costs(batch, seq)
    cost = clock.lap()
    lowest = min_peak(costs)
    budget = BudgetSpec.parse(BUDGET).resolve(costs, lowest.predicted_peak)
    chosen = solve(costs, budget)
    solved = clock.lap()
    total = tuple(a + b + c for a, b, c in zip(build, cost, solved))
    return {
        "card": card, "shape": f"{batch} x {seq}", "source": kind, "options": len(costs.options),
        "blocks": costs.n_blocks, "build": build, "costs": cost, "solve": solved, "total": total,
        "min_peak": lowest.predicted_peak, "none_peak": costs.none_peak(), "budget": budget,
        "predicted": chosen.predicted_peak, "exact": chosen.exact, "plan": chosen.names(costs),
        "excluded": costs.excluded, "costs_obj": costs,
    }


EXACT = ("kept", "reach", "flops", "pointwise", "before", "measured_peaks")


def gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def grouped(names: tuple[str, ...]) -> str:
    groups: list[list] = []
    for i, name in enumerate(names):
        if groups and groups[-1][0] == name:
            groups[-1][2] = i
        else:
            groups.append([name, i, i])
    return "; ".join(f"{a}-{b} {n}" if a != b else f"{a} {n}" for n, a, b in groups)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="reports/budget-plan-speed.md")
    args = parser.parse_args(argv)

    warm = GPTConfig(vocab_size=64, block_size=64, n_layer=1, n_head=2, n_embd=32, dropout=0.0)
    MeasuredCosts(build_model(warm, "sdpa"), pointwise_weight=1.0).costs(1, 16)
    SimulatedCosts(warm, "bfloat16", "flash", "cuda").costs(1, 16)

    clock = Clock()
    weight = measure_pointwise_weight("cpu", torch.float32)
    weight_s = clock.lap()[0]
    print(f"pointwise weight on this CPU: {weight:.1f} FLOP-equivalents per element (timed in {weight_s:.2f} s; "
          "shared by the CPU rows, so measured and simulated costs plan alike)")
    results = []
    for card, batch, seq, kind, target in ROWS:
        row = plan(card, batch, seq, kind, weight)
        row["target"] = target
        if kind == "simulated-cpu":
            twin = next(r for r in results if r["card"] == card and r["source"] == "measured" and r["shape"] == row["shape"])
            row["equal"] = all(getattr(row["costs_obj"], f) == getattr(twin["costs_obj"], f) for f in EXACT)
            row["same_plan"] = row["plan"] == twin["plan"]
            print(f"  {card}: simulated costs equal the measured ones: {row['equal']}; same plan: {row['same_plan']}")
        results.append(row)
        wall, cpu = row["total"]
        print(f"{card} {row['shape']} ({kind}, {row['options']} options x {row['blocks']} blocks): plan in {wall:.2f} s wall, "
              f"{cpu:.2f} s CPU (build {row['build'][0]:.2f}, costs {row['costs'][0]:.2f}, solve {row['solve'][0] * 1e3:.1f} ms); "
              f"target < {target:.0f} s: {'met' if wall < target else 'MISSED'} (CPU time: {'met' if cpu < target else 'missed'})",
              flush=True)

    load = os.getloadavg()
    lines = [
        "# Budget planning speed",
        "",
        "Command: `.venv/bin/python benchmarks/budget_plan_speed.py` (see its docstring for what is timed).",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} with "
        f"{torch.get_num_threads()} threads, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1 / 5 / 15 min) "
        f"when the run ended; Python {sys.version.split()[0]}. Budget for each solve: `{BUDGET}`. Pointwise weight "
        f"of the CPU rows: {weight:.1f} FLOP-equivalents per element, timed once in {weight_s:.2f} s (not in the rows). "
        "The gpt3-2.7b rows have no pointwise weight (no CUDA device to time it) and no offload (no transfer weight).",
        "",
        "| card | batch x seq | costs | options x blocks | build s | costs s | solve ms | plan s (wall) | plan s (CPU) | target | met (wall / CPU) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        wall, cpu = r["total"]
        lines.append(
            f"| {r['card']} | {r['shape']} | {r['source']} | {r['options']} x {r['blocks']} | {r['build'][0]:.2f} | "
            f"{r['costs'][0]:.2f} | {r['solve'][0] * 1e3:.1f} | {wall:.2f} | {cpu:.2f} | < {r['target']:.0f} s | "
            f"{'yes' if wall < r['target'] else 'no'} / {'yes' if cpu < r['target'] else 'no'} |"
        )
    lines += [""]
    for r in results:
        if "equal" in r:
            lines.append(f"{r['card']} {r['shape']}: simulated (target cpu) costs equal the measured ones in kept, reach, "
                         f"flops, pointwise, before and uniform peaks: {'yes' if r['equal'] else 'NO'}; same plan: "
                         f"{'yes' if r['same_plan'] else 'NO'}.")
    lines += ["", "Plans (at the budget above):", ""]
    for r in results:
        lines.append(
            f"- {r['card']} {r['shape']}: min {gib(r['min_peak'])}, none {gib(r['none_peak'])}, budget {gib(r['budget'])}, "
            f"predicted {gib(r['predicted'])} ({'exact' if r['exact'] else 'fallback'} solve): {grouped(r['plan'])}"
        )
        for name, why in r["excluded"].items():
            lines.append(f"  - option {name} left out: {why}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
