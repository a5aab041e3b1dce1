"""The compiled plan (``activation.budget.compile_policy``) over a budget sweep, beside compile's own knob and the
fixed strategies, every block compiled.

    python benchmarks/compile_plan_sweep.py                          # tiny + llama-tiny, 4 x 256, fp32, 40 rounds
    python benchmarks/compile_plan_sweep.py --cards tiny --spans 0 50 100 --rounds 20

Per card, every configuration compiles each block (``nn.Module.compile``, Inductor on the CPU) in a fresh Dynamo
state (``torch._dynamo.reset()``; Inductor's FX graph cache stays on unless ``--cold``), then:

- **peak**: one warmed-up training step's added peak from the CPU allocator's events
  (``probes.compiled.measure_compiled_step``: refused if a block ran eager or recompiled), plus the resident state
  (parameters, buffers, optimizer state), so it reads in the plan's unit, the whole step's peak;
- **time**: every configuration of a card and the eager no-checkpointing reference side by side, each in a process
  of its own, one step each per round in the same interleaved rounds (``compile_duel``); a ratio is the median of
  per-round ratios with its ~95% interval; compile time (first forward + backward and optimizer step) apart;
- **agreement**: the first loss and every gradient against the same model run eager.

Configurations: ``plan, min + N%`` (our compiled plan at each budget of the sweep, ``--spans``, planned as the
runner plans it: checked compiled and priced against the fixed strategies); ``none`` / ``full`` / ``every_k`` /
``selective_op`` (the fixed strategies the plan is priced against, ``compile_policy.FIXED_CANDIDATES``, compiled per
block as the per-block policies it prices, ``fixed_policies``: ``selective_op`` as a torch selective-checkpoint
policy saving the candidates its default list names, ``every_k`` with k = 2);
``knob B`` (no checkpoint, ``torch._functorch.config.activation_memory_budget = B`` while the blocks compile).
The claims are judged from the measured rows and written to ``reports/compile-plan-sweep.{md,json}``: each plan
point against every fitting fixed strategy and every knob at equal or lower measured peak, paired round by round
(process CPU time), in ``compile_duel.Paired``'s words (``faster``, ``not slower``, ``SLOWER``, ``unresolved``) read
against the run's floor: the furthest its controls reached from 1.0x, where the controls are every two rows that
are one configuration in two processes (``knob 1`` is torch's default, so ``fixed none``; a plan that is a fixed
strategy).
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

import compile_duel  # benchmarks/ is first on sys.path when this file runs

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.activation.budget.compile_policy import FIXED_CANDIDATES, compile_blocks, fixed_policies, plan_compiled, record_block_ops
from pytest_flashckpt.activation.options import FULL, NONE
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.models.anatomy import get_blocks
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.probes.compiled import import_inductor, measure_compiled_step, missing_compiler
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


def measure(name: str, card, shape, policies, knob: float | None, eager_check) -> dict:
    """One configuration, compiled per block (``policies``: per block a SavePolicy or None, no checkpoint): its
    compile time, agreement with eager and peak; its time is measured side by side afterwards (``time_card``), from
    the worker spec this row carries."""
    torch._dynamo.reset()
    torch._functorch.config.activation_memory_budget = 1.0 if knob is None else knob
    row: dict = {"config": name, "knob": knob, "blocks": ["none" if p is None else p.name for p in policies],
                 "spec": {"card": card.name, "batch": shape[0], "seq": shape[1], "knob": knob, "threads": torch.get_num_threads(),
                          "policies": compile_duel.policy_spec(policies)}}
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
    except Exception as exc:  # a configuration that fails is a finding, recorded with its message
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    finally:
        torch._functorch.config.activation_memory_budget = 1.0
    print(json.dumps(row), flush=True)
    return row


EAGER = "eager none (reference)"


def time_card(rows: list[dict], spec: dict, rounds: int) -> dict:
    """Every measured configuration of ``rows`` and the eager reference stepped side by side
    (``compile_duel.run_duel``); each row gains its step time and its ratios to the reference (wall and CPU, median
    and ~95% interval), its graphs compiled while timed; returns the per-round samples (the record keeps them)."""
    timed = {r["config"]: r["spec"] for r in rows if "error" not in r}
    specs = {EAGER: {**spec, "policies": None, "knob": None}, **timed}
    started = time.perf_counter()
    samples = compile_duel.run_duel(specs, rounds, on_round=lambda r, n: print(f"round {r}/{n}", file=sys.stderr, flush=True))
    for row in rows:
        if row["config"] not in timed:
            continue
        got = samples[row["config"]]
        wall, cpu = (compile_duel.paired(samples, row["config"], EAGER, key) for key in ("wall", "cpu"))
        row.update(step_s=statistics.median(got["wall"]), step_cpu_s=statistics.median(got["cpu"]),
                   time_ratio=wall.median, time_ratio_interval=[wall.low, wall.high],
                   cpu_ratio=cpu.median, cpu_ratio_interval=[cpu.low, cpu.high],
                   recompiles_while_timed=got["recompiles"], load_avg=os.getloadavg()[0])
    return {"rounds": rounds, "wall_s": time.perf_counter() - started, "samples": samples}


def sweep_card(card_name: str, shape, spans, knobs, rounds: int) -> dict:
    card = load_card(card_name)
    eager_check = loss_and_grads(Trainer.create(build_model(card, "sdpa"), *shape))
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
        rows.append({"family": "fixed", **measure(f"fixed {name}", card, shape, policies, None, eager_check)})
    for knob in knobs:
        rows.append({"family": "knob", **measure(f"knob {knob:g}", card, shape, [None] * n_blocks, knob, eager_check)})
    for span, entry in plans.items():
        plan = entry["plan"]
        row = measure(f"plan min + {span:g}%", card, shape, plan.policies, None, eager_check)
        rows.append({"family": "plan", "span": span, "budget_bytes": plan.shape_plan.budget_bytes,
                     "predicted_peak_bytes": plan.predicted_peak, "recompute_flops": plan.flops, "recompute_cost": plan.cost,
                     "plan_fixed": plan.fixed, "solved_recompute_cost": plan.shape_plan.plan.cost,
                     "compiled_check_peak_bytes": plan.compiled_peak, "replans": plan.replans,
                     "fixed_checks": [{"name": c.name, "cost": c.cost, "simulated_peak_bytes": c.simulated_peak} for c in plan.fixed_checks],
                     "plan_note": plan.fixed_note(),
                     "distinct_policies": plan.distinct_policies, "exact_menus": plan.exact_menus, "plan_s": entry["plan_s"], **row})
    measured = [r for r in rows if "family" in r]
    timing = time_card(measured, {"card": card.name, "batch": shape[0], "seq": shape[1], "threads": torch.get_num_threads()}, rounds)
    return {"card": card_name, "rows": rows, "min_peak_bytes": plans[spans[0]]["plan"].shape_plan.min_peak,
            "none_peak_bytes": plans[spans[0]]["plan"].shape_plan.none_peak, "timing": timing}


SEVERITY = ("faster", "not slower", "unresolved", "SLOWER")  # a point's verdict is its worst pairing's


def judge(record: dict, floor: float) -> list[dict]:
    """Per plan point: peak <= budget; time, paired round by round (process CPU time), against every fitting fixed
    strategy and every knob row at equal or lower measured peak, in words read against the run's ``floor``; the
    point's verdict on each side is its worst pairing's. A row that is the plan's own configuration (a plan that
    is a fixed strategy; ``knob 1`` beside a plan of no checkpointing) is its twin, a control, not a rival."""
    verdicts = []
    for card in record["cards"]:
        samples = card["timing"]["samples"]
        ok = [r for r in card["rows"] if "cpu_ratio" in r]
        for plan in (r for r in ok if r.get("family") == "plan"):
            fitting = [r for r in ok if r.get("family") == "fixed" and r["peak_bytes"] <= plan["budget_bytes"]]
            lower_knobs = [r for r in ok if r.get("family") == "knob" and r["peak_bytes"] <= plan["peak_bytes"]]
            verdicts.append({
                "card": card["card"], "config": plan["config"], "budget_bytes": plan["budget_bytes"], "peak_bytes": plan["peak_bytes"],
                "fits": plan["peak_bytes"] <= plan["budget_bytes"], "cpu_ratio": plan["cpu_ratio"],
                "cpu_ratio_interval": plan["cpu_ratio_interval"], "plan_fixed": plan.get("plan_fixed"),
                "vs_fixed": pairings(samples, plan, [r for r in fitting if not _same(r, plan)], floor),
                "vs_knob": pairings(samples, plan, [r for r in lower_knobs if not _same(r, plan)], floor),
                "twin": pairings(samples, plan, [r for r in fitting + lower_knobs if _same(r, plan)], floor),
            })
    for v in verdicts:
        v["fixed_word"], v["knob_word"] = worst(v["vs_fixed"]), worst(v["vs_knob"])
    return verdicts


def _same(a: dict, b: dict) -> bool:
    """One configuration: the same per-block policies under the same activation_memory_budget (1.0, torch's
    default, when no knob is set)."""
    return a["blocks"] == b["blocks"] and (a.get("knob") if a.get("knob") is not None else 1.0) == \
        (b.get("knob") if b.get("knob") is not None else 1.0)


def controls(record: dict) -> tuple[list[dict], float]:
    """Every two timed rows of a card that are one configuration in two processes, paired both ways (what the
    method reads where the truth is 1.0x), and the run's floor they set (``compile_duel.floor_of``)."""
    found, pairs = [], []
    for card in record["cards"]:
        samples = card["timing"]["samples"]
        ok = [r for r in card["rows"] if "cpu_ratio" in r]
        for i, a in enumerate(ok):
            for b in ok[i + 1:]:
                if _same(a, b):
                    for x, y in ((a, b), (b, a)):
                        pair = compile_duel.paired(samples, x["config"], y["config"], "cpu")
                        pairs.append(pair)
                        found.append({"card": card["card"], "a": x["config"], "b": y["config"], "median": pair.median,
                                      "low": pair.low, "high": pair.high, "stray": pair.stray})
    return found, compile_duel.floor_of(pairs)


def pairings(samples: dict, plan: dict, others: list[dict], floor: float) -> list[dict]:
    """The plan against each of ``others``, paired per round by process CPU time (``compile_duel.Paired``)."""
    found = []
    for other in others:
        pair = compile_duel.paired(samples, plan["config"], other["config"], "cpu")
        found.append({"against": other["config"], "peak_bytes": other["peak_bytes"], "median": pair.median,
                      "low": pair.low, "high": pair.high, "word": pair.word(floor)})
    return found


def worst(found: list[dict]) -> str | None:
    return max((p["word"] for p in found), key=SEVERITY.index, default=None)


def judged(record: dict) -> dict:
    """``record`` with its controls, floor and verdicts computed from the per-round samples it holds."""
    record["controls"], record["floor"] = controls(record)
    record["verdicts"] = judge(record, record["floor"])
    return record


def _pairing_text(p: dict) -> str:
    return f"{p['against']}: {p['word']} {p['median']:.3f}x ({p['low']:.2f}-{p['high']:.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cards", nargs="+", default=["tiny", "llama-tiny"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--spans", type=float, nargs="+", default=[0.0, 25.0, 50.0, 75.0, 100.0], help="budgets as min + N%%")
    parser.add_argument("--knobs", type=float, nargs="+", default=[1.0, 0.6, 0.3, 0.0])
    parser.add_argument("--rounds", type=int, default=40, help="side-by-side rounds per card (compile_duel)")
    parser.add_argument("--out", default=str(ROOT / "reports" / "compile-plan-sweep"))
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--cold", action="store_true", help="Inductor's caches off: every compile time cold (slower)")
    parser.add_argument("--render", action="store_true",
                        help="only re-judge the per-round samples of the .json at --out and re-render the .md")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.render:
        record = judged(json.loads(out.with_suffix(".json").read_text()))
        out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
        write(record, out)
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
    judged(record)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    write(record, out)
    return 0


def _mib(n) -> str:
    return "—" if n is None else f"{n / MiB:.2f}"


def _ratio(r, interval=None) -> str:
    if r is None:
        return "—"
    return f"{r:.3f}x" if interval is None else f"{r:.3f}x ({interval[0]:.2f}-{interval[1]:.2f})"


def write(record: dict, out: Path) -> None:
    """The measured tables and the claims' verdicts (everything above the hand-written discussion marker)."""
    la0, la1 = record["load_avg_start"], record["load_avg_end"]
    lines = [
        f"# Compiled plan vs compile's knob and fixed strategies, every block compiled: batch {record['batch_size']} x {record['seq_len']}, fp32",
        "",
        f"Command: `{record['command']}` (torch {record['torch']}, {record['machine']}, {record['cpus']} CPUs, "
        f"{record['threads']} torch threads; per card, every configuration and the eager reference in a process of "
        f"its own, one step each in each of {record['rounds']} interleaved rounds (`compile_duel`); Inductor caches {'off (cold compiles)' if record['cold'] else 'on (a graph an earlier configuration compiled is a cache hit)'}; wall {record['wall_s']:.0f} s; load average {la0[0]:.2f} at the start, "
        f"{la1[0]:.2f} at the end).",
        "",
        "Time: per round, a configuration's step / the reference's step in the same round; the median over the rounds"
        " and its ~95% interval (order statistics). Wall time and the process CPU time are both shown; the claims are"
        " judged on CPU time, which waiting for a core does not inflate.",
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
        lines += ["", "| configuration | budget (MiB) | predicted (MiB) | measured peak (MiB) | wall step / eager (95% interval) | CPU time / eager (95% interval) | step (s) | compile (s) | recompiles while timed | blocks | loss diff | grad diff |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in (r for r in card["rows"] if "family" in r):
            if "error" in r:
                lines.append(f"| {r['config']} | error: `{r['error']}` | | | | | | | | | | |")
                continue
            blocks = "; ".join(r["blocks"]) if len(set(r["blocks"])) > 1 else f"all {r['blocks'][0]}"
            label = r["config"] + (f" (fixed `{r['plan_fixed']}`)" if r.get("plan_fixed") else "")
            lines.append(f"| {label} | {_mib(r.get('budget_bytes'))} | {_mib(r.get('predicted_peak_bytes'))} | "
                         f"{_mib(r['peak_bytes'])} | {_ratio(r['time_ratio'], r['time_ratio_interval'])} | "
                         f"{_ratio(r['cpu_ratio'], r['cpu_ratio_interval'])} | {r['step_s']:.3f} | "
                         f"{r['compile_s']:.0f} | {r['recompiles_while_timed']} | {blocks} | {r['loss_abs_diff']:.1e} | {r['grad_max_abs_diff']:.1e} |")
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
              "Each plan point paired round by round (CPU time, plan / rival) with every fitting fixed strategy and every "
              f"knob at equal or lower measured peak, read against the run's floor F = {record['floor']:.1%} (below): "
              "`faster` when the 95% interval lies wholly below 1 - F, `SLOWER` when it lies wholly above 1 + F, "
              "`not slower` when its top is within 1 + F, `unresolved` otherwise (`compile_duel.Paired.word`). "
              "A point's verdict on each side is its worst pairing's. A row that is the plan's own configuration (a plan "
              "that is a fixed strategy; `knob 1`, torch's default, beside a plan of no checkpointing) is its twin: a "
              "control, not a rival.", "",
              "| card | plan | measured <= budget | CPU time / eager | vs fitting fixed | pairings | vs knob at or below | pairings | twin (control) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for v in record["verdicts"]:
        picked = f" (fixed `{v['plan_fixed']}`)" if v.get("plan_fixed") else ""
        fixed = "; ".join(_pairing_text(p) for p in v["vs_fixed"]) or "none fits (other than itself)"
        knob = "; ".join(f"{_pairing_text(p)} at {_mib(p['peak_bytes'])} MiB" for p in v["vs_knob"]) or "none at or below"
        twin = "; ".join(_pairing_text(p) for p in v["twin"]) or "—"
        lines.append(f"| {v['card']} | {v['config']}{picked} | {'yes' if v['fits'] else 'NO'} ({_mib(v['peak_bytes'])} of {_mib(v['budget_bytes'])}) | "
                     f"{_ratio(v['cpu_ratio'], v['cpu_ratio_interval'])} | **{v['fixed_word'] or '—'}** | {fixed} | "
                     f"**{v['knob_word'] or '—'}** | {knob} | {twin} |")
    words = [w for v in record["verdicts"] for w in (v["fixed_word"], v["knob_word"]) if w is not None]
    counts = ", ".join(f"{words.count(w)} {w}" for w in SEVERITY if words.count(w))
    lines += ["", f"Over {len(record['verdicts'])} plan points and {len(words)} sides judged: {counts}."]
    if record.get("controls"):
        widest = max(record["controls"], key=lambda c: c["stray"])
        lines += ["", "Controls: one configuration in two processes, paired both ways, where the truth is 1.0x. The furthest "
                  "any of them reaches from 1.0x is the run's floor F (at least "
                  f"{compile_duel.MIN_FLOOR:.0%}; a run past {compile_duel.FLOOR_CAP:.0%} claims nothing, `compile_duel.floor_of`):", ""]
        lines += [f"- {c['card']}: {c['a']} / {c['b']}: {c['median']:.3f}x ({c['low']:.3f}-{c['high']:.3f})"
                  for c in record["controls"]]
        lines += ["", f"F = {record['floor']:.1%}, set by {widest['card']}: {widest['a']} / {widest['b']}"
                  + (f": past the {compile_duel.FLOOR_CAP:.0%} cap, so this run claims nothing." if record["floor"] > compile_duel.FLOOR_CAP else ".")]
    else:
        lines += ["", "No controls in this run (no two rows of one configuration): no floor was measured, every word is `unresolved`."]
    lines += ["", "<!-- measured tables above, written by the script; discussion below, by hand -->", ""]
    md = out.with_suffix(".md")
    previous = md.read_text() if md.exists() else ""
    marker = "<!-- measured tables above, written by the script; discussion below, by hand -->"
    discussion = previous.split(marker, 1)[1].lstrip("\n") if marker in previous else ""
    md.write_text("\n".join(lines) + discussion)
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
