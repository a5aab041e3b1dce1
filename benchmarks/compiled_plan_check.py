"""Does the compiled plan hold its budget when its blocks are compiled, and does the compiled-step simulator see
why not? (issue 33, item 3). On the micro card of ``tests/activation/test_compile_policy.py``'s compiled tests, per
shape: (a) the plan's predicted whole-step peak and budget (``plan_compiled``, eager segments), (b)
``simulate_compiled_step``'s peak for the same plan's policies (fake tensors, Inductor's plan), (c) the measured
allocator peak of the compiled step (``probes.compiled.measure_compiled_step`` plus the resident state); then the
same for the compiled-checked plan (``plan_compiled(..., compiled_peak=simulate.compiled.compiled_peak_check(...))``:
re-planned down the front while the simulated compiled peak is over the budget).

    python benchmarks/compiled_plan_check.py                  # micro card, 8 x 64 and 2 x 32, min + 50%
    python benchmarks/compiled_plan_check.py --cards tiny llama-tiny --shapes 4x256 --spans 0 25 50 75 100 \\
        --no-measure --out reports/compiled-plan-check-4x256  # simulated; measured peaks from compile-plan-sweep.json

Writes ``reports/compiled-plan-check.{md,json}`` (the command line is written into the report by this script).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from pytest_flashckpt.activation.budget import MeasuredCosts
from pytest_flashckpt.activation.budget.compile_policy import compile_blocks, plan_compiled
from pytest_flashckpt.activation.options import FULL, NONE
from pytest_flashckpt.models import GPTConfig, build_model
from pytest_flashckpt.models.cards import load_card
from pytest_flashckpt.simulate.costs import SimulatedCosts
from pytest_flashckpt.training import Trainer

ROOT = Path(__file__).resolve().parent.parent


def micro() -> GPTConfig:  # tests/activation/test_compile_policy.py's micro card
    return GPTConfig(vocab_size=64, block_size=64, n_layer=3, n_head=2, n_embd=32, dropout=0.0)


def measured(config, plan, shape) -> dict:
    from pytest_flashckpt.probes.compiled import dynamos_hidden_warnings, import_inductor, measure_compiled_step

    import_inductor()
    torch._dynamo.reset()
    try:
        trainer = Trainer.create(build_model(config, "sdpa"), *shape)
        compile_blocks(trainer.model, plan.policies)
        with dynamos_hidden_warnings():
            trainer.train_step()
            trainer.train_step()
            reading = measure_compiled_step(trainer.train_step, expected_regions=len(plan.policies))
        resident = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                        for t in trainer.state_tensors()}.values())
    finally:
        torch._dynamo.reset()
    return {"resident_bytes": resident, "added_peak_bytes": reading.added_peak_bytes,
            "peak_bytes": resident + reading.added_peak_bytes}


def sweep_rows() -> dict:
    """reports/compile-plan-sweep.json's measured plan rows, by (card, batch x seq, span): what a plan the check left
    unchanged was measured at."""
    path = ROOT / "reports" / "compile-plan-sweep.json"
    if not path.exists():
        return {}
    sweep = json.loads(path.read_text())
    shape = f"{sweep['batch_size']}x{sweep['seq_len']}"
    return {(card["card"], shape, row["span"]): row for card in sweep["cards"] for row in card["rows"]
            if row.get("family") == "plan"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", nargs="+", default=["micro"],
                        help="micro (the test's card; costs measured by the exact probe) or model card names (costs "
                             "simulated, as benchmarks/compile_plan_sweep.py plans them)")
    parser.add_argument("--shapes", nargs="+", default=["8x64", "2x32"])
    parser.add_argument("--spans", type=float, nargs="+", default=[50.0], help="budgets as min + N%%")
    parser.add_argument("--no-measure", action="store_true", help="simulate only (no real compile, no allocator)")
    parser.add_argument("--out", default=str(ROOT / "reports" / "compiled-plan-check"))
    args = parser.parse_args(argv)
    from pytest_flashckpt.simulate.compiled import compiled_peak_check, simulate_compiled_step

    torch.set_num_threads(1)
    started = time.perf_counter()
    swept = sweep_rows()
    rows = []
    for card_name in args.cards:
        config = micro() if card_name == "micro" else load_card(card_name)
        for text in args.shapes:
            shape = tuple(int(v) for v in text.split("x"))
            model = build_model(config, "sdpa")
            if card_name == "micro":
                source = MeasuredCosts(model, (NONE, FULL), pointwise_weight=128.0)
            else:
                source = SimulatedCosts(config, "float32", "sdpa", "cpu", options=(NONE, FULL))
            for span in args.spans:
                budget = f"min + {span:g}%"
                plan = plan_compiled(model, budget, shape, source)
                checked = plan_compiled(model, budget, shape, source, compiled_peak=compiled_peak_check(config, *shape))
                first = checked.compiled_checks[0]
                assert first.names == plan.names  # the check's first plan is the unchecked one
                sweep = swept.get((card_name, text, span))
                for kind, p, sim in (("eager segments", plan, first.simulated_peak), ("compiled-checked", checked, checked.compiled_peak)):
                    row = {"card": card_name, "shape": text, "budget": budget, "plan": kind, "policies": list(p.names),
                           "budget_bytes": p.shape_plan.budget_bytes, "predicted_peak": p.shape_plan.plan.predicted_peak,
                           "sim_peak": sim, "recompute_flops": p.shape_plan.plan.flops}
                    if kind == "compiled-checked":
                        row.update(replans=checked.replans, note=checked.compiled_note())
                    if kind == "eager segments" and card_name == "micro":
                        none = simulate_compiled_step(config, *shape, "none", "block")
                        row.update(sim_state=none["state_bytes"], sim_none_peak=none["state_bytes"] + none["peak_bytes"],
                                   sim_regions=simulate_compiled_step(config, *shape, "budget", "block", policies=p.policies)["regions"],
                                   sim_none_regions=none["regions"])
                    if sweep is not None and sweep["budget_bytes"] == p.shape_plan.budget_bytes and \
                            sweep["predicted_peak_bytes"] == p.shape_plan.plan.predicted_peak:
                        row["sweep_measured_peak"] = sweep["peak_bytes"]  # the same plan, measured by the sweep
                    if not args.no_measure and (kind == "eager segments" or checked.replans):
                        row.update({f"meas_{k}": v for k, v in measured(config, p, shape).items()})
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    out = Path(args.out)
    command = "python benchmarks/compiled_plan_check.py " + " ".join(sys.argv[1:] if argv is None else argv)
    head = (f"# The compiled plan vs its compiled step (issue 33, item 3)\n\nCommand: `{command.strip()}` (torch "
            f"{torch.__version__}, {platform.platform()}, 1 intra-op thread, float32; wall "
            f"{time.perf_counter() - started:.0f} s; load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores). "
            "Whole-step peak bytes (resident state included). (a) the plan's prediction from eager segments, (b) "
            "simulate_compiled_step for the same policies, (c) the CPU allocator (measured here; *sweep*: the same "
            "plan's peak as reports/compile-plan-sweep.json measured it, matched by budget and predicted peak). "
            "A compiled-checked plan with 0 re-plans is the eager-segment plan itself.\n\n"
            "| card | shape | budget | plan | policies | budget (B) | (a) predicted | (b) simulated | (c) measured | (b)-(c) | "
            "(c)-budget | re-plans | recompute FLOPs |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        meas, src = r.get("meas_peak_bytes"), ""
        if meas is None and r.get("sweep_measured_peak") is not None:
            meas, src = r["sweep_measured_peak"], " (sweep)"
        gap = "" if meas is None else f"{r['sim_peak'] - meas:+,} ({(r['sim_peak'] - meas) / meas:+.2%})"
        over = "" if meas is None else f"{meas - r['budget_bytes']:+,}"
        lines.append(f"| {r['card']} | {r['shape']} | {r['budget']} | {r['plan']} | {', '.join(r['policies'])} | "
                     f"{r['budget_bytes']:,} | {r['predicted_peak']:,} | {r['sim_peak']:,} | "
                     f"{'' if meas is None else f'{meas:,}{src}'} | {gap} | {over} | {r.get('replans', '')} | "
                     f"{r['recompute_flops']:,} |")
    notes = [f"- {r['card']} {r['shape']} {r['budget']}: {r['note']}" for r in rows if r.get("note")]
    regions = [f"- {r['card']} {r['shape']} {r['budget']}, eager-segment plan: simulated regions {json.dumps(r['sim_regions'])}; "
               f"without checkpoints (none everywhere): peak {r['sim_none_peak']:,} B, regions {json.dumps(r['sim_none_regions'])}"
               for r in rows if r.get("sim_regions")]
    lines += ["", "The compiled check's record (``CompilePlan.compiled_note()``):", "", *notes]
    if regions:
        lines += ["", "Compiled graphs simulated (forward / backward, calls per step, inputs, the partitioner's saved set):",
                  "", *regions]
    out.with_suffix(".md").write_text(head + "\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"command": command, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
