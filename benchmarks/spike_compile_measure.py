"""Spike for issue 33, step 0: how a torch.compile'd training step is measured (CPU, Inductor).

    python benchmarks/spike_compile_measure.py                       # tiny + llama-tiny, batch 2 x 128, 1 thread
    python benchmarks/spike_compile_measure.py --cards tiny --rounds 3

Questions, each answered by a measurement in ``reports/spike-compile-measure.md`` (raw numbers in the ``.json``):

1. Does a step compiled under the ``cpu`` probe's ``TorchDispatchMode`` run eager? (Dynamo's counters, and the
   profiler's "Torch-Compiled Region" events of a later step.)
2. Does the CPU allocator's view (``torch.profiler`` memory events, ``probes.allocator``) see Inductor's buffers,
   and does it equal the exact probe's peak on an eager step? Then per configuration (whole model, per block with
   ``apply_ac`` outside / inside the compiled region): peak, Dynamo frames, graph breaks, recompiles after warm-up,
   compile time vs step time, loss / gradient agreement with eager.
3. Does selective checkpointing (``context_fn``) compose with per-block compile (bytes the forward leaves alive
   for the backward), and what does ``activation_memory_budget`` 0.5 / 0.8 / 1.0 change?
4. How Inductor finds a C++ compiler, and how fast and with what message a compile fails without one.

Inductor's caches are disabled (``force_disable_caches``) so compile times are cold. Timing is interleaved with
the eager reference in one process (median of per-round ratios); the load average is recorded beside it.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
import torch._dynamo
from torch._C._profiler import _EventType
from torch._dynamo.utils import counters
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.models.anatomy import get_anatomy, get_blocks
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.probes.allocator import allocator_added_peak
from pytest_flashckpt.probes.cpu import LiveTensorProbe
from pytest_flashckpt.runner.timing import interleaved
from pytest_flashckpt.training import Trainer

ROOT = Path(__file__).resolve().parent.parent
COMPILED_REGION = "Torch-Compiled Region"
COMPILED_GRAPH = "## Call CompiledFxGraph"


def _walk(nodes):
    for node in nodes:
        yield node
        yield from _walk(node.children)


def profiled(step: Callable[[], object]) -> dict:
    """One step under ``torch.profiler`` (``profile_memory``): the allocator's added peak, the bytes still allocated
    at the end over the start (``retained``), how many compiled regions / compiled backward graphs ran, and the
    bytes allocated inside Inductor's compiled graphs (an allocation whose ancestor is a ``CompiledFxGraph`` call).
    What ``step`` returns is kept alive until the profile ends (a forward's loss holds its saved tensors)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        result = step()
    del result
    events = list(_walk(prof.profiler.kineto_results.experimental_event_tree()))
    allocs = sorted((e for e in events if e.tag == _EventType.Allocation and str(e.extra_fields.device) == "cpu"),
                    key=lambda e: e.start_time_ns)
    first = allocs[0].extra_fields
    start = first.total_allocated - first.alloc_size
    inside = 0
    for e in allocs:
        node = e.parent
        while node is not None and not node.name.startswith(COMPILED_GRAPH):
            node = node.parent
        if node is not None and e.extra_fields.alloc_size > 0:
            inside += e.extra_fields.alloc_size
    names = collections.Counter(e.name for e in events)
    return {
        "added_peak_bytes": max(e.extra_fields.total_allocated for e in allocs) - start,
        "retained_bytes": allocs[-1].extra_fields.total_allocated - start,
        "compiled_regions": sum(n for name, n in names.items() if name.startswith(COMPILED_REGION)),
        "compiled_backwards": names.get("CompiledFunctionBackward", 0),
        "bytes_allocated_in_compiled_graphs": inside,
    }


def dynamo_counts() -> dict:
    return {
        "frames_total": counters["frames"]["total"], "frames_ok": counters["frames"]["ok"],
        "unique_graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values()),
        "graph_break_reasons": sorted({reason.strip().splitlines()[0] + (" (" + reason.split("Developer debug context:")[1].strip().splitlines()[0] + ")"
                                       if "Developer debug context:" in reason else "") for reason in counters["graph_break"]})[:5],
    }


# ---- the configurations: how each compiles a fresh model --------------------------------------------------------

def compile_blocks(model, where: str) -> None:
    """torchtitan-style per-block compile. ``where`` says where the ``apply_ac`` wrapper (already installed, or
    none) sits: "inside" compiles the whole block call (``nn.Module.compile``: the checkpoint runs inside the
    compiled region, traced as a higher-order op); "outside" compiles only the block's original forward, so
    ``torch.utils.checkpoint`` (and its selective contexts) wraps the compiled function from eager."""
    for block in get_blocks(model, get_anatomy(model)):
        wrapper = block.__dict__.get("forward")
        if where == "outside" and wrapper is not None:
            wrapper.forward = torch.compile(wrapper.forward)
        else:
            block.compile()


SAVED_BY_TORCH_SAC = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
                      torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}


def save_matmuls_and_attention(ctx, func, *args, **kwargs) -> CheckpointPolicy:
    """A plain torch selective-checkpoint policy (no roles, no counting): a module-level function, so Dynamo can
    trace ``context_fn=functools.partial(create_selective_checkpoint_contexts, this)`` (it accepts only a plain
    function or a ``functools.partial`` as ``context_fn``)."""
    return CheckpointPolicy.MUST_SAVE if func in SAVED_BY_TORCH_SAC else CheckpointPolicy.PREFER_RECOMPUTE


def install_torch_sac(model, how: str | None) -> None:
    """Each block's forward under ``torch.utils.checkpoint`` with the policy above; ``how`` as in ``compile_blocks``
    ("outside": the checkpoint wraps a compiled forward; "inside": the block call, checkpoint included, compiled)."""
    context_fn = functools.partial(create_selective_checkpoint_contexts, save_matmuls_and_attention)
    for block in get_blocks(model, get_anatomy(model)):
        inner = torch.compile(block.forward) if how == "outside" else block.forward

        def forward(*args, inner=inner, **kwargs):  # a Python frame of ours: Dynamo starts tracing at user code
            return checkpoint(inner, *args, use_reentrant=False, context_fn=context_fn, **kwargs)

        block.forward = forward
        if how == "inside":
            block.compile()


CONFIGS = {
    # name: (activation strategy, how compiled, activation_memory_budget)
    "eager": ("none", None, None),
    "eager, full AC": ("full", None, None),
    "eager, selective_op AC": ("selective_op", None, None),
    "whole model": ("none", "whole", None),
    "whole model, activation_memory_budget 0.8": ("none", "whole", 0.8),
    "whole model, activation_memory_budget 0.5": ("none", "whole", 0.5),
    "per block": ("none", "inside", None),
    "per block, full AC outside compile": ("full", "outside", None),
    "per block, full AC inside compile": ("full", "inside", None),
    "per block, selective_op AC outside compile": ("selective_op", "outside", None),
    "per block, selective_op AC inside compile": ("selective_op", "inside", None),
    "eager, torch SAC (partial policy)": ("torch_sac", None, None),
    "per block, torch SAC outside compile": ("torch_sac", "outside", None),
    "per block, torch SAC inside compile": ("torch_sac", "inside", None),
}


def build(card, shape, strategy: str, how: str | None) -> Trainer:
    model = build_model(card, "sdpa")
    if strategy == "torch_sac":
        install_torch_sac(model, how)
        return Trainer.create(model, *shape)
    if strategy != "none":
        apply_ac(model, ActivationConfig(strategy=strategy))
    trainer = Trainer.create(model, *shape)
    if how == "whole":
        trainer.model = torch.compile(model)
    elif how is not None:
        compile_blocks(model, how)
    return trainer


def loss_and_grads(trainer: Trainer) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Forward and backward on the batch at position 0 (no optimizer step): the agreement check, and for a compiled
    model the step that compiles its forward and backward."""
    x, y = trainer.batch(0)
    loss = trainer.model(x, y)
    loss.backward()
    grads = [p.grad.detach().clone() for p in trainer.model.parameters()]
    trainer.optimizer.zero_grad(set_to_none=True)
    return loss.detach(), grads


def measure(name: str, card, shape, reference: Trainer, eager_check, rounds: int) -> dict:
    strategy, how, budget = CONFIGS[name]
    torch._dynamo.reset()
    counters.clear()
    torch._functorch.config.activation_memory_budget = 1.0 if budget is None else budget
    row: dict = {"config": name, "strategy": strategy, "compiled": how, "activation_memory_budget": budget}
    try:
        trainer = build(card, shape, strategy, how)
        t0 = time.perf_counter()
        loss, grads = loss_and_grads(trainer)
        row["first_fwd_bwd_s"] = time.perf_counter() - t0  # compiled: includes compiling forward and backward
        ref_loss, ref_grads = eager_check
        row["loss_abs_diff"] = abs(loss - ref_loss).item()
        row["grad_max_abs_diff"] = max((g - r).abs().max().item() for g, r in zip(grads, ref_grads))
        trainer.train_step()  # warm-up: optimizer state exists from here on
        row["warmup"] = dynamo_counts()
        torch._dynamo.config.error_on_recompile = True  # a recompile after warm-up is an error, not a slow step
        try:
            row.update(profiled(trainer.train_step))
            forward = profiled(lambda: trainer.model(*trainer.batch()))
            row["forward_retained_bytes"] = forward["retained_bytes"]  # loss + what the graph saved for backward
            ref_s, s = interleaved([reference.train_step, trainer.train_step], rounds, 1, torch.device("cpu"))
        finally:
            torch._dynamo.config.error_on_recompile = False
        row["after_warmup"] = dynamo_counts()
        row["recompiles_after_warmup"] = row["after_warmup"]["unique_graphs"] - row["warmup"]["unique_graphs"]
        ratios = [a / b for a, b in zip(s, ref_s)]
        row.update(step_s=statistics.median(s), time_ratio=statistics.median(ratios),
                   time_ratio_range=[min(ratios), max(ratios)], load_avg=os.getloadavg()[0])
    except Exception as exc:  # a configuration that does not compose is a finding, recorded with its message
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    print(json.dumps(row), flush=True)
    return row


def probe_cross_check(card, shape) -> dict:
    """Question 2's control: on an eager step, the exact probe's added peak beside the allocator's."""
    trainer = build(card, shape, "none", None)
    trainer.train_step()
    with LiveTensorProbe().track(resident=trainer.state_tensors()) as reading:
        trainer.train_step()
    return {"probe_added_peak_bytes": reading.added_peak_bytes, "profiler_added_peak_bytes": allocator_added_peak(trainer.train_step)}


def under_probe(card, shape) -> dict:
    """Question 1: (a) a model whose first compiled call is under the probe; (b) a model compiled and warmed up
    outside it, then one step under it, then a profiled step outside it (does it still run compiled?)."""
    out = {}
    torch._dynamo.reset()
    counters.clear()
    trainer = build(card, shape, "none", "whole")
    with LiveTensorProbe().track(resident=trainer.state_tensors()) as reading:
        trainer.train_step()
    after = profiled(trainer.train_step)
    out["first_call_under_probe"] = {**dynamo_counts(), "probe_added_peak_bytes": reading.added_peak_bytes,
                                     "later_step_compiled_regions": after["compiled_regions"]}
    torch._dynamo.reset()
    counters.clear()
    trainer = build(card, shape, "none", "whole")
    trainer.train_step()
    trainer.train_step()
    before = profiled(trainer.train_step)
    with LiveTensorProbe().track(resident=trainer.state_tensors()) as reading:
        trainer.train_step()
    after = profiled(trainer.train_step)
    out["warmed_up_then_probe"] = {
        **dynamo_counts(), "compiled_regions_before_probe": before["compiled_regions"],
        "allocator_peak_before_probe": before["added_peak_bytes"], "probe_added_peak_bytes": reading.added_peak_bytes,
        "compiled_regions_after_probe": after["compiled_regions"], "allocator_peak_after_probe": after["added_peak_bytes"],
    }
    print(json.dumps(out), flush=True)
    return out


NO_COMPILER_CHILD = """
import time, torch
from torch._inductor import cpp_builder, exc
t0 = time.perf_counter()
try:
    cpp_builder.get_cpp_compiler(); print("DETECT found")
except exc.InvalidCxxCompiler as e:
    print("DETECT", type(e).__name__, "%.3f s" % (time.perf_counter() - t0), str(e).strip().splitlines()[0])
f = torch.compile(lambda x: (x.sin() + 1).sum())
t0 = time.perf_counter()
try:
    f(torch.randn(64)); print("COMPILE ok")
except Exception as e:
    print("COMPILE", type(e).__name__, "%.1f s" % (time.perf_counter() - t0), str(e).strip().splitlines()[0][:300])
"""


def no_compiler() -> dict:
    """Question 4: a child process with an empty PATH (no g++) and no CXX: the cheap detection, and a compile."""
    with tempfile.TemporaryDirectory() as empty:
        env = {k: v for k, v in os.environ.items() if k not in ("CXX", "CC")}
        env.update(PATH=empty, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", NO_COMPILER_CHILD], env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith(("DETECT", "COMPILE"))]
    out = {"child_wall_s": time.perf_counter() - t0, "lines": lines, "returncode": done.returncode,
           "stderr_tail": done.stderr.strip().splitlines()[-1:] if done.returncode else []}
    print(json.dumps(out), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", nargs="+", default=["tiny", "llama-tiny"])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (the machine is shared)")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS), metavar="CONFIG")
    parser.add_argument("--out", default=str(ROOT / "reports" / "spike-compile-measure"))
    parser.add_argument("--render", action="store_true", help="only re-render the .md from the .json at --out")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.render:
        write(json.loads(out.with_suffix(".json").read_text()), out)
        return 0
    torch.set_num_threads(args.threads)
    torch.compiler.config.force_disable_caches = True
    start = time.perf_counter()
    shape = (args.batch, args.seq)
    record: dict = {"command": "python benchmarks/spike_compile_measure.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                    "torch": torch.__version__, "machine": platform.platform(), "threads": args.threads,
                    "batch": args.batch, "seq": args.seq, "rounds": args.rounds, "cards": {}}
    record["no_compiler"] = no_compiler()
    for name in args.cards:
        card = load_card(name)
        reference = build(card, shape, "none", None)
        reference.train_step()
        eager_check = loss_and_grads(build(card, shape, "none", None))
        entry = {"cross_check": probe_cross_check(card, shape), "under_probe": under_probe(card, shape)}
        entry["rows"] = [measure(config, card, shape, reference, eager_check, args.rounds) for config in args.configs]
        record["cards"][name] = entry
    torch._functorch.config.activation_memory_budget = 1.0
    record["wall_s"] = time.perf_counter() - start
    record["load_avg_end"] = os.getloadavg()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    write(record, out)
    return 0


def _mib(n) -> str:
    return "—" if n is None else f"{n / 2**20:.2f}"


def write(record: dict, out: Path) -> None:
    """The measured tables (the discussion and recommendation are kept in the .md below the marker line)."""
    marker = "<!-- measured tables above, written by the script; discussion below, by hand -->"
    old = out.with_suffix(".md").read_text() if out.with_suffix(".md").exists() else ""
    discussion = old.split(marker, 1)[1] if marker in old else "\n"
    lines = ["# Spike: measuring a torch.compile'd training step (issue 33, step 0)", "",
             f"Command: `{record['command']}` (torch {record['torch']}, {record['machine']}, {record['threads']} thread(s),"
             f" batch {record['batch']} x {record['seq']}, sdpa, float32, Inductor caches disabled, {record['rounds']}"
             f" interleaved rounds; wall {record['wall_s']:.0f} s; load average at the end"
             f" {', '.join(f'{x:.2f}' for x in record['load_avg_end'])} on 2 shared cores: times are indicative).", ""]
    for name, entry in record["cards"].items():
        cc, up = entry["cross_check"], entry["under_probe"]
        a, b = up["first_call_under_probe"], up["warmed_up_then_probe"]
        lines += [f"## {name}", "",
                  f"Eager step, added peak: `cpu` probe {cc['probe_added_peak_bytes']:,} B, profiler allocator events"
                  f" {cc['profiler_added_peak_bytes']:,} B (difference {cc['profiler_added_peak_bytes'] - cc['probe_added_peak_bytes']:+,} B).", "",
                  f"Compiled model, first call under the `cpu` probe: Dynamo frames total {a['frames_total']}, ok {a['frames_ok']},"
                  f" graphs {a['unique_graphs']}; probe peak {a['probe_added_peak_bytes']:,} B; a later step outside the probe"
                  f" ran {a['later_step_compiled_regions']} compiled region(s).", "",
                  f"Compiled and warmed up outside the probe: {b['compiled_regions_before_probe']} compiled region(s) per step,"
                  f" allocator peak {b['allocator_peak_before_probe']:,} B; one step under the probe (probe peak"
                  f" {b['probe_added_peak_bytes']:,} B); the next step outside it: {b['compiled_regions_after_probe']}"
                  f" compiled region(s), allocator peak {b['allocator_peak_after_probe']:,} B.", "",
                  "| configuration | peak added (MiB) | forward leaves alive (MiB) | allocated inside compiled graphs (MiB) |"
                  " compiled regions / backwards per step | frames ok/total (graphs) | graph breaks | recompiles after warm-up |"
                  " first fwd+bwd (s) | step (s) | step / eager (min-max) | load | loss diff | grad max diff |",
                  "|" + "---|" * 14]
        for r in entry["rows"]:
            if "error" in r:
                lines.append(f"| {r['config']} | error: `{r['error']}` |" + " |" * 12)
                continue
            w = r["after_warmup"]
            lo, hi = r["time_ratio_range"]
            lines.append(
                f"| {r['config']} | {_mib(r['added_peak_bytes'])} | {_mib(r['forward_retained_bytes'])} |"
                f" {_mib(r['bytes_allocated_in_compiled_graphs'])} | {r['compiled_regions']} / {r['compiled_backwards']} |"
                f" {w['frames_ok']}/{w['frames_total']} ({w['unique_graphs']}) | {w['graph_breaks']} | {r['recompiles_after_warmup']} |"
                f" {r['first_fwd_bwd_s']:.1f} | {r['step_s']:.3f} | {r['time_ratio']:.2f}x ({lo:.2f}-{hi:.2f}) | {r['load_avg']:.1f} |"
                f" {r['loss_abs_diff']:.1e} | {r['grad_max_abs_diff']:.1e} |")
        breaks = sorted({reason for r in entry["rows"] if "after_warmup" in r for reason in r["after_warmup"]["graph_break_reasons"]})
        if breaks:
            lines += ["", "Graph-break reasons seen: " + "; ".join(f"`{b}`" for b in breaks)]
        lines.append("")
    nc = record["no_compiler"]
    lines += ["## No C++ compiler (child process, empty PATH, no CXX)", ""]
    lines += [f"- `{line}`" for line in nc["lines"]] + [f"- child process wall {nc['child_wall_s']:.1f} s, exit {nc['returncode']}", ""]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n" + marker + discussion)
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
