"""torch.compile's ``activation_memory_budget`` beside our ``budget`` strategy, measured in one run.

    .venv/bin/python benchmarks/compile_budget.py                 # tiny, batch 4 x 256, budgets 1.0 0.5 0.0
    .venv/bin/python benchmarks/compile_budget.py --budgets 1.0 0.3 --rounds 5

PyTorch's answer to "state the memory you can afford" is ``torch._functorch.config.activation_memory_budget``
(torch.compile only): a knapsack over the compiled graph's saved tensors whose budget is a fraction of the
*estimated activations*, not a physical peak. This script compiles the same training step at each budget and
measures, side by side with our planner at the same shape:

- the step's peak memory added on top of the resident state, from the CPU allocator's own events
  (``torch.profiler`` with ``profile_memory``: the exact ``cpu`` probe is a dispatch mode, and Inductor's generated
  code allocates without passing through Python dispatch, so the probe cannot see inside a compiled step). Our plans
  are measured the same way here, so the two columns compare like with like;
- step time, interleaved round by round with the eager no-checkpointing reference (median of per-round ratios).

Compile time is recorded per budget (each budget recompiles: ``torch._dynamo.reset()``). Writes
``reports/compile-budget.{md,json}``. Nothing is asserted.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_gap import profiler_added_peak  # noqa: E402  (the allocator-event peak, shared with probe_gap)

from pytest_flashckpt.activation import apply_budget  # noqa: E402
from pytest_flashckpt.models.cards import build_model, load_card  # noqa: E402
from pytest_flashckpt.runner.timing import interleaved  # noqa: E402
from pytest_flashckpt.simulate.costs import SimulatedCosts  # noqa: E402
from pytest_flashckpt.training import Trainer  # noqa: E402


def added_peak(trainer: Trainer) -> int:
    trainer.train_step()  # warm-up (and, compiled, the compile itself): optimizer state exists afterwards
    return profiler_added_peak(trainer.train_step)


def timed_ratio(trainer: Trainer, reference: Trainer, rounds: int) -> dict:
    ref_s, s = interleaved([reference.train_step, trainer.train_step], rounds, 1, torch.device("cpu"))
    ratios = [a / b for a, b in zip(s, ref_s)]
    return {"time_ratio": statistics.median(ratios), "time_ratio_range": [min(ratios), max(ratios)], "step_time_s": statistics.median(s)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--card", default="tiny")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--budgets", type=float, nargs="+", default=[1.0, 0.5, 0.0])
    parser.add_argument("--plans", type=float, nargs="+", default=[0.0, 50.0, 100.0], help="our budgets, as min + N%%")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="reports/compile-budget")
    parser.add_argument("--render", action="store_true", help="only re-render the .md and .png from the .json at --out")
    args = parser.parse_args(argv)
    if args.render:
        out = Path(args.out)
        write(json.loads(out.with_suffix(".json").read_text()), out)
        return 0
    config, shape = load_card(args.card), (args.batch, args.seq)
    start = time.perf_counter()

    reference = Trainer.create(build_model(config, "sdpa"), *shape)
    rows = [{"what": "eager, no checkpointing (reference)", "added_peak_bytes": added_peak(reference), "time_ratio": 1.0,
             "time_ratio_range": [1.0, 1.0], "compile_s": None}]
    print(rows[-1], flush=True)
    source = SimulatedCosts(config, "float32", "sdpa", "cpu")
    for span in args.plans:
        model = build_model(config, "sdpa")
        applied = apply_budget(model, f"min + {span}%", shape, source=source)
        trainer = Trainer.create(model, *shape)
        row = {"what": f"budget strategy, min + {span:g}% ({applied.plans[shape].budget_bytes / 2**20:.1f} MiB whole-step)",
               "added_peak_bytes": added_peak(trainer), "compile_s": None, **timed_ratio(trainer, reference, args.rounds)}
        rows.append(row)
        print(row, flush=True)
    for budget in args.budgets:
        torch._dynamo.reset()
        torch._functorch.config.activation_memory_budget = budget
        model = build_model(config, "sdpa")
        trainer = Trainer.create(model, *shape)
        trainer.model = torch.compile(model)
        t0 = time.perf_counter()
        trainer.train_step()  # compiles forward and backward
        compile_s = time.perf_counter() - t0
        row = {"what": f"torch.compile, activation_memory_budget {budget:g}", "added_peak_bytes": added_peak(trainer),
               "compile_s": compile_s, **timed_ratio(trainer, reference, args.rounds)}
        rows.append(row)
        print(row, flush=True)
    torch._functorch.config.activation_memory_budget = 1.0
    record = {"card": config.name, "batch_size": args.batch, "seq_len": args.seq, "rounds": args.rounds, "rows": rows,
              "torch": torch.__version__, "machine": platform.platform(), "wall_s": time.perf_counter() - start,
              "command": "python benchmarks/compile_budget.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    write(record, out)
    return 0


def write(record: dict, out: Path) -> None:
    """The markdown table and the peak-vs-time plot, from a record (``--render`` re-draws them from the .json)."""
    rows = record["rows"]
    plot(rows, out.with_suffix(".png"), f"{record['card']} b{record['batch_size']}xs{record['seq_len']}")
    lines = [
        f"# torch.compile activation_memory_budget vs the budget strategy: {record['card']}, batch {record['batch_size']} x {record['seq_len']}, sdpa",
        "",
        f"Command: `{record['command']}` (torch {record['torch']}, {record['machine']}; {record['rounds']} interleaved rounds"
        f" against the eager reference; wall {record['wall_s']:.0f} s). Peak added by one training step on top of the"
        " resident state, from the CPU allocator's events (torch.profiler, profile_memory), for every row alike.",
        "",
        "| configuration | step peak added (MiB) | step time / eager reference (min-max) | compile |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lo, hi = r["time_ratio_range"]
        compile_s = "—" if r["compile_s"] is None else f"{r['compile_s']:.0f} s"
        lines.append(f"| {r['what']} | {r['added_peak_bytes'] / 2**20:.2f} | {r['time_ratio']:.3f}x ({lo:.2f}-{hi:.2f}) | {compile_s} |")
    lines += ["", "How to read it: torch.compile's budget is a fraction of its own activation estimate, so equal numbers"
              " in the two families do not mean equal memory; compare the measured columns. A compiled step is also"
              " faster for reasons unrelated to checkpointing (fused kernels), which its time ratio includes.", ""]
    lines += [f"![peak vs step time]({out.with_suffix('.png').name})", ""]
    out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for family, marker in (("budget strategy", "o-"), ("torch.compile", "s")):
        chosen = [r for r in rows if r["what"].startswith(family)]
        ax.plot([r["added_peak_bytes"] / 2**20 for r in chosen], [r["time_ratio"] for r in chosen], marker, label=family)
        for r in chosen:
            label = r["what"].split("budget ")[-1] if family == "torch.compile" else r["what"].split(",")[1].split("(")[0].strip()
            ax.annotate(label, (r["added_peak_bytes"] / 2**20, r["time_ratio"]), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ref = rows[0]
    ax.plot(ref["added_peak_bytes"] / 2**20, 1.0, "k*", markersize=10, label="eager, no checkpointing")
    ax.set_xlabel("step peak added on top of the resident state (MiB, allocator events)")
    ax.set_ylabel("step time / eager reference (median of rounds)")
    ax.set_title(f"activation_memory_budget vs budget strategy: {title}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
