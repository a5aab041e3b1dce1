"""The compiled plan (``activation.budget.compile_policy``) over a budget sweep, beside compile's own knob and the
fixed strategies, every block compiled.

    python benchmarks/compile_plan_sweep.py                          # tiny + llama-tiny, 4 x 256, fp32, 3 rounds
    python benchmarks/compile_plan_sweep.py --cards tiny --spans 0 50 100 --rounds 5

Per card, every configuration compiles each block (``nn.Module.compile``, Inductor on the CPU) in a fresh Dynamo
state (``torch._dynamo.reset()``; Inductor's FX graph cache stays on unless ``--cold``), then:

- **peak**: one warmed-up training step's added peak from the CPU allocator's events
  (``probes.compiled.measure_compiled_step``: refused if a block ran eager or recompiled), plus the resident state
  (parameters, buffers, optimizer state), so it reads in the plan's unit, the whole step's peak;
- **time**: step time interleaved round by round with the eager no-checkpointing reference
  (``runner.timing.interleaved``), the median of per-round ratios; compile time (first forward + backward and
  optimizer step) apart;
- **agreement**: the first loss and every gradient against the same model run eager.

Configurations: ``plan, min + N%`` (our compiled plan at each budget of the sweep, ``--spans``, planned as the
runner plans it: checked compiled and priced against the fixed strategies); ``none`` / ``full`` / ``every_k`` /
``selective_op`` (the fixed strategies the plan is priced against, ``compile_policy.FIXED_CANDIDATES``, compiled per
block as the per-block policies it prices, ``fixed_policies``: ``selective_op`` as a torch selective-checkpoint
policy saving the candidates its default list names, ``every_k`` with k = 2);
``knob B`` (no checkpoint, ``torch._functorch.config.activation_memory_budget = B`` while the blocks compile).
The claims are judged from the measured rows and written to ``reports/compile-plan-sweep.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch._dynamo.utils import counters

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.activation.budget.compile_policy import FIXED_CANDIDATES, compile_blocks, fixed_policies, plan_compiled, record_block_ops
from pytest_flashckpt.activation.options import FULL, NONE
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.models.anatomy import get_blocks
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.probes.compiled import import_inductor, measure_compiled_step, missing_compiler
from pytest_flashckpt.runner.timing import interleaved
from pytest_flashckpt.simulate.compiled import compiled_peak_check
from pytest_flashckpt.simulate.costs import SimulatedCosts
from pytest_flashckpt.training import Trainer

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20


def resident_bytes(trainer: Trainer) -> int:
    """Bytes the training state holds between steps (each storage once): what the allocator's added peak is over."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in trainer.state_tensors()}
    return sum(storages.values())


def loss_and_grads(trainer: Trainer) -> tuple[float, list[torch.Tensor]]:
    x, y = trainer.batch(0)
    loss = trainer.model(x, y)
    loss.backward()
    grads = [p.grad.detach().clone() for p in trainer.model.parameters()]
    trainer.optimizer.zero_grad(set_to_none=True)
    return loss.item(), grads




def with_cpu_time(step, sink: list[float]):
    """``step`` that also appends the process CPU time it took to ``sink``: on a machine shared with other sessions
    (load average many times the cores) wall time mostly measures waiting for a core; CPU time does not."""

    def timed():
        start = time.process_time()
        step()
        sink.append(time.process_time() - start)

    return timed


def measure(name: str, card, shape, policies, knob: float | None, reference: Trainer, eager_check, rounds: int) -> dict:
    """One configuration, compiled per block; ``policies``: per block a SavePolicy or None (no checkpoint)."""
    torch._dynamo.reset()
    torch._functorch.config.activation_memory_budget = 1.0 if knob is None else knob
    row: dict = {"config": name, "knob": knob, "blocks": ["none" if p is None else p.name for p in policies]}
    try:
        model = build_model(card, "sdpa")
        compile_blocks(model, policies)
        trainer = Trainer.create(model, *shape)
        t0 = time.perf_counter()
        loss, grads = loss_and_grads(trainer)  # compiles every block's forward and backward
        trainer.train_step()  # optimizer state exists from here on
        row["compile_s"] = time.perf_counter() - t0
        ref_loss, ref_grads = eager_check
        row["loss_abs_diff"] = abs(loss - ref_loss)
        row["grad_max_abs_diff"] = max((g - r).abs().max().item() for g, r in zip(grads, ref_grads))
        n_blocks = len(get_blocks(model))
        reading = measure_compiled_step(trainer.train_step, expected_regions=n_blocks)
        row["added_peak_bytes"] = reading.added_peak_bytes
        row["resident_bytes"] = resident_bytes(trainer)
        row["peak_bytes"] = reading.added_peak_bytes + row["resident_bytes"]
        graphs = counters["stats"]["unique_graphs"]
        ref_cpu, cpu = [], []
        ref_s, s = interleaved([with_cpu_time(reference.train_step, ref_cpu), with_cpu_time(trainer.train_step, cpu)],
                               rounds, 1, torch.device("cpu"))
        row["recompiles_while_timed"] = counters["stats"]["unique_graphs"] - graphs
        ratios = [a / b for a, b in zip(s, ref_s)]
        cpu_ratios = [a / b for a, b in zip(cpu, ref_cpu)]
        row.update(step_s=statistics.median(s), time_ratio=statistics.median(ratios),
                   time_ratio_range=[min(ratios), max(ratios)], step_cpu_s=statistics.median(cpu),
                   cpu_ratio=statistics.median(cpu_ratios), cpu_ratio_range=[min(cpu_ratios), max(cpu_ratios)],
                   load_avg=os.getloadavg()[0])
    except Exception as exc:  # a configuration that fails is a finding, recorded with its message
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    finally:
        torch._functorch.config.activation_memory_budget = 1.0
    print(json.dumps(row), flush=True)
    return row


def sweep_card(card_name: str, shape, spans, knobs, rounds: int) -> dict:
    card = load_card(card_name)
    reference = Trainer.create(build_model(card, "sdpa"), *shape)
    eager_check = loss_and_grads(Trainer.create(build_model(card, "sdpa"), *shape))
    reference.train_step()
    source = SimulatedCosts(card, "float32", "sdpa", "cpu", options=(NONE, FULL))
    costs = source.costs(*shape)
    planner_model = build_model(card, "sdpa")
    plans = {}
    # as the runner plans: checked compiled (simulated, re-planned while over) and priced against the fixed
    # strategies; one check for the sweep, so each policies' compiled step is simulated once (cached)
    check = compiled_peak_check(card, *shape)
    for span in spans:
        t0 = time.perf_counter()
        plan = plan_compiled(planner_model, f"min + {span:g}%", shape, source, compiled_peak=check)
        plans[span] = {"plan": plan, "plan_s": time.perf_counter() - t0}
        print(plan.describe(), flush=True)
    n_blocks = costs.n_blocks
    rows = []
    # the eager controls: the allocator's view against the simulated peaks the plan is made from
    for name, option in (("eager none (control)", NONE), ("eager full (control)", FULL)):
        model = build_model(card, "sdpa")
        apply_ac(model, ActivationConfig(strategy=option.name))
        trainer = Trainer.create(model, *shape)
        trainer.train_step()
        reading = measure_compiled_step(trainer.train_step, expected_regions=0)
        peak = reading.added_peak_bytes + resident_bytes(trainer)
        rows.append({"config": name, "peak_bytes": peak, "predicted_peak_bytes": costs.predict_peak([costs.option_index(option)] * n_blocks)})
        print(json.dumps(rows[-1]), flush=True)
    block_ops = record_block_ops(planner_model, *shape)
    fixed = {name: fixed_policies(name, block_ops) for name in FIXED_CANDIDATES}  # the ones the plan is priced against
    for name, policies in fixed.items():
        rows.append({"family": "fixed", **measure(f"fixed {name}", card, shape, policies, None, reference, eager_check, rounds)})
    for knob in knobs:
        rows.append({"family": "knob", **measure(f"knob {knob:g}", card, shape, [None] * n_blocks, knob, reference, eager_check, rounds)})
    for span, entry in plans.items():
        plan = entry["plan"]
        row = measure(f"plan min + {span:g}%", card, shape, plan.policies, None, reference, eager_check, rounds)
        rows.append({"family": "plan", "span": span, "budget_bytes": plan.shape_plan.budget_bytes,
                     "predicted_peak_bytes": plan.predicted_peak, "recompute_flops": plan.flops, "recompute_cost": plan.cost,
                     "plan_fixed": plan.fixed, "solved_recompute_cost": plan.shape_plan.plan.cost,
                     "compiled_check_peak_bytes": plan.compiled_peak, "replans": plan.replans,
                     "fixed_checks": [{"name": c.name, "cost": c.cost, "simulated_peak_bytes": c.simulated_peak} for c in plan.fixed_checks],
                     "plan_note": plan.fixed_note(),
                     "distinct_policies": plan.distinct_policies, "exact_menus": plan.exact_menus, "plan_s": entry["plan_s"], **row})
    return {"card": card_name, "rows": rows, "min_peak_bytes": plans[spans[0]]["plan"].shape_plan.min_peak,
            "none_peak_bytes": plans[spans[0]]["plan"].shape_plan.none_peak}


def judge(record: dict) -> list[dict]:
    """Per plan point: peak <= budget; time vs the fastest fitting fixed strategy and vs the fastest knob row at
    equal or lower measured peak (None where no such row exists)."""
    verdicts = []
    for card in record["cards"]:
        ok = [r for r in card["rows"] if "time_ratio" in r]
        for plan in (r for r in ok if r.get("family") == "plan"):
            fitting = [r for r in ok if r.get("family") == "fixed" and r["peak_bytes"] <= plan["budget_bytes"]]
            lower_knobs = [r for r in ok if r.get("family") == "knob" and r["peak_bytes"] <= plan["peak_bytes"]]
            key = "cpu_ratio" if "cpu_ratio" in plan else "time_ratio"
            best_fixed = min(fitting, key=lambda r: r[key], default=None)
            best_knob = min(lower_knobs, key=lambda r: r[key], default=None)
            verdicts.append({
                "card": card["card"], "config": plan["config"], "budget_bytes": plan["budget_bytes"], "peak_bytes": plan["peak_bytes"],
                "fits": plan["peak_bytes"] <= plan["budget_bytes"], "time_ratio": plan[key], "judged_by": key,
                "ratio_range": plan[key + "_range"] if key == "cpu_ratio" else plan["time_ratio_range"],
                "fastest_fitting_fixed": best_fixed and best_fixed["config"], "fixed_ratio": best_fixed and best_fixed[key],
                "fixed_range": best_fixed and best_fixed[key + "_range" if key == "cpu_ratio" else "time_ratio_range"],
                "fastest_knob_at_or_below": best_knob and best_knob["config"], "knob_ratio": best_knob and best_knob[key],
                "knob_range": best_knob and best_knob[key + "_range" if key == "cpu_ratio" else "time_ratio_range"],
                "knob_peak_bytes": best_knob and best_knob["peak_bytes"],
                "plan_fixed": plan.get("plan_fixed"),
                "vs_fixed": versus(plan, best_fixed, key, same=best_fixed is not None and best_fixed["blocks"] == plan["blocks"]),
                "vs_knob": versus(plan, best_knob, key),
            })
    return verdicts


def versus(plan: dict, other: dict | None, key: str, same: bool = False) -> str:
    """Whether ``plan`` is never slower than ``other`` by the median per-round ratio ``key``: ``not slower``;
    ``same configuration`` (the plan is that fixed strategy, measured again); ``within spread`` when slower by no
    more than the larger relative half-range of the two rows' per-round ratios; ``SLOWER`` past it."""
    if other is None:
        return "no such row"
    if same:
        return "same configuration"
    rkey = key + "_range"
    spread = max((r[rkey][1] - r[rkey][0]) / 2 / r[key] for r in (plan, other))
    diff = plan[key] / other[key] - 1
    if diff <= 0:
        return f"not slower ({diff:+.1%})"
    return f"{'within spread' if diff <= spread else 'SLOWER'} ({diff:+.1%}, spread ±{spread:.1%})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cards", nargs="+", default=["tiny", "llama-tiny"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--spans", type=float, nargs="+", default=[0.0, 25.0, 50.0, 75.0, 100.0], help="budgets as min + N%%")
    parser.add_argument("--knobs", type=float, nargs="+", default=[1.0, 0.6, 0.3, 0.0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "reports" / "compile-plan-sweep"))
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--cold", action="store_true", help="Inductor's caches off: every compile time cold (slower)")
    parser.add_argument("--render", action="store_true", help="only re-render the .md from the .json at --out")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.render:
        write(json.loads(out.with_suffix(".json").read_text()), out)
        return 0
    reason = missing_compiler()
    if reason is not None:
        print(f"compile_plan_sweep: {reason}", file=sys.stderr)
        return 2
    import_inductor()
    torch.compiler.config.force_disable_caches = args.cold
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    shape = (args.batch, args.seq)
    record: dict = {
        "command": "python benchmarks/compile_plan_sweep.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "torch": torch.__version__, "machine": platform.platform(), "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
        "batch_size": args.batch, "seq_len": args.seq, "rounds": args.rounds, "cold": args.cold, "load_avg_start": os.getloadavg(),
        "cards": [sweep_card(name, shape, args.spans, args.knobs, args.rounds) for name in args.cards],
    }
    record["load_avg_end"] = os.getloadavg()
    record["wall_s"] = time.perf_counter() - start
    record["verdicts"] = judge(record)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    write(record, out)
    return 0


def _mib(n) -> str:
    return "—" if n is None else f"{n / MiB:.2f}"


def _ratio(r, span=None) -> str:
    if r is None:
        return "—"
    return f"{r:.3f}x" if span is None else f"{r:.3f}x ({span[0]:.2f}-{span[1]:.2f})"


def _cpu(row) -> str:
    return _ratio(row.get("cpu_ratio"), row.get("cpu_ratio_range")) if "cpu_ratio" in row else "—"


def write(record: dict, out: Path) -> None:
    """The measured tables and the claims' verdicts (everything above the hand-written discussion marker)."""
    la0, la1 = record["load_avg_start"], record["load_avg_end"]
    lines = [
        f"# Compiled plan vs compile's knob and fixed strategies, every block compiled: batch {record['batch_size']} x {record['seq_len']}, fp32",
        "",
        f"Command: `{record['command']}` (torch {record['torch']}, {record['machine']}, {record['cpus']} CPUs, "
        f"{record['threads']} torch threads; {record['rounds']} interleaved rounds per configuration against the eager "
        f"reference; Inductor caches {'off (cold compiles)' if record['cold'] else 'on (a graph an earlier configuration compiled is a cache hit)'}; wall {record['wall_s']:.0f} s; load average {la0[0]:.2f} at the start, "
        f"{la1[0]:.2f} at the end, on a machine shared with other sessions: read times as indicative).",
        "",
        "Peak: the whole step's, as the plan's budget reads it: the allocator's added peak of one warmed-up step"
        " (profiler memory events; every block ran compiled, no recompilation) plus the resident state.",
        "",
    ]
    for card in record["cards"]:
        lines += [f"## {card['card']}", "",
                  f"Plan range: min {_mib(card['min_peak_bytes'])} MiB (every block `full`), none {_mib(card['none_peak_bytes'])} MiB"
                  " (eager no-checkpointing, simulated).", ""]
        controls = [r for r in card["rows"] if "family" not in r]
        for r in controls:
            lines.append(f"- {r['config']}: measured {_mib(r['peak_bytes'])} MiB, simulated {_mib(r['predicted_peak_bytes'])} MiB"
                         f" (difference {r['peak_bytes'] - r['predicted_peak_bytes']:+,} B)")
        lines += ["", "| configuration | budget (MiB) | predicted (MiB) | measured peak (MiB) | wall step / eager (min-max) | CPU time / eager (min-max) | step (s) | compile (s) | blocks | loss diff | grad diff |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in (r for r in card["rows"] if "family" in r):
            if "error" in r:
                lines.append(f"| {r['config']} | error: `{r['error']}` | | | | | | | | | |")
                continue
            lo, hi = r["time_ratio_range"]
            blocks = "; ".join(r["blocks"]) if len(set(r["blocks"])) > 1 else f"all {r['blocks'][0]}"
            label = r["config"] + (f" (fixed `{r['plan_fixed']}`)" if r.get("plan_fixed") else "")
            lines.append(f"| {label} | {_mib(r.get('budget_bytes'))} | {_mib(r.get('predicted_peak_bytes'))} | "
                         f"{_mib(r['peak_bytes'])} | {r['time_ratio']:.3f}x ({lo:.2f}-{hi:.2f}) | {_cpu(r)} | {r['step_s']:.3f} | "
                         f"{r['compile_s']:.0f} | {blocks} | {r['loss_abs_diff']:.1e} | {r['grad_max_abs_diff']:.1e} |")
        lines.append("")
        noted = [r for r in card["rows"] if r.get("family") == "plan" and "plan_note" in r]
        if noted:
            lines += ["Each plan, checked compiled and priced against the fixed strategies (`CompilePlan.fixed_note()`; "
                      "compiled check peak, re-plans):", ""]
            lines += [f"- {r['config']}: planned in {r['plan_s']:.0f} s (simulations cached across the sweep's budgets); compiled "
                      f"check {_mib(r.get('compiled_check_peak_bytes'))} MiB, {r.get('replans', 0)} re-plan(s); {r['plan_note']}"
                      for r in noted]
            lines.append("")
    lines += ["## Claims, per plan point", "",
              "| card | plan | measured <= budget | plan | fastest fitting fixed | vs fixed | knob at equal or lower peak | vs knob |",
              "|---|---|---|---|---|---|---|---|"]
    for v in record["verdicts"]:
        fixed = "none fits" if v["fixed_ratio"] is None else f"{v['fastest_fitting_fixed']} {_ratio(v['fixed_ratio'], v.get('fixed_range'))}"
        knob = ("none at or below" if v["knob_ratio"] is None else
                f"{v['fastest_knob_at_or_below']} {_ratio(v['knob_ratio'], v.get('knob_range'))} ({_mib(v['knob_peak_bytes'])} MiB)")
        picked = f" (fixed `{v['plan_fixed']}`)" if v.get("plan_fixed") else ""
        lines.append(f"| {v['card']} | {v['config']}{picked} | {'yes' if v['fits'] else 'NO'} ({_mib(v['peak_bytes'])} of {_mib(v['budget_bytes'])}) | "
                     f"{_ratio(v['time_ratio'], v.get('ratio_range'))} ({v.get('judged_by', 'time_ratio')}) | {fixed} | {v.get('vs_fixed', '')} | "
                     f"{knob} | {v.get('vs_knob', '')} |")
    lines += ["", "<!-- measured tables above, written by the script; discussion below, by hand -->", ""]
    md = out.with_suffix(".md")
    previous = md.read_text() if md.exists() else ""
    marker = "<!-- measured tables above, written by the script; discussion below, by hand -->"
    discussion = previous.split(marker, 1)[1].lstrip("\n") if marker in previous else ""
    md.write_text("\n".join(lines) + discussion)
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
