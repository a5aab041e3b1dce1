"""Spike for issue 32 item 7 (compiled pipeline stages): does a ``torch.distributed.pipelining`` rank train with every
block of its stages compiled (after the activation strategy, before ``fully_shard``: torchtitan's order), exactly,
without graph breaks or recompiles, and what does compile do to its forward + backward memory?

    python benchmarks/spike_compiled_stages.py           # 2 gloo ranks (pp 2), writes reports/spike-compiled-stages.md
    python benchmarks/spike_compiled_stages.py --print
    python benchmarks/spike_compiled_stages.py --tp 2    # 4 gloo ranks (pp 2 x tp 2 inside each stage),
                                                         # writes reports/spike-compiled-tp-stages.md

The ranks run ``benchmarks/spike_compiled_stages_worker.py`` (what each configuration records: its docstring).
Recorded, not asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from report_output import produced_by, write_or_print  # noqa: E402
from spike_compiled_stages_worker import BATCH, CARD, SEQ  # noqa: E402

from pytest_flashckpt.distributed import launcher  # noqa: E402

REPORTS = {1: ROOT / "reports" / "spike-compiled-stages.md", 2: ROOT / "reports" / "spike-compiled-tp-stages.md"}
WORKER = ROOT / "benchmarks" / "spike_compiled_stages_worker.py"


def measure(tp: int) -> list[dict]:
    world = 2 * tp
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        launcher.run(launcher.Launch(world, timeout_s=1800), str(WORKER), [str(out), str(tp)], log_path=out / "launch.log")
        return [json.loads((out / f"rank-{r}.json").read_text(encoding="utf-8")) for r in range(world)]


def mib(n: int) -> str:
    return f"{n / 2**20:.3f} MiB"


def render(ranks: list[dict], provenance: str) -> str:
    tp = ranks[0].get("tp", 1)
    title = "compiled pipeline stages" + (f" with tensor parallel {tp} inside" if tp > 1 else "")
    layout = f"pp 2 x tp {tp} on {2 * tp} gloo ranks (tensor parallel inside each stage)" if tp > 1 else "pp 2 on 2 gloo ranks"
    lines = [f"# Spike: {title} (issue 32 item 7)", "", provenance, "",
             f"{layout}, a Llama card (`llama-tiny` with `{json.dumps(CARD)}`), fp32, batch {BATCH} x {SEQ}, "
             "every block of each stage compiled (Inductor, `compile.scope: block`). *grad diff*: the largest absolute "
             "difference of the rank's gradients from one eager process on the full batch (first step). *added*: "
             "the CPU allocator's forward + backward peak over its start, one step after two warm steps, compiled "
             "and eager; *probe*: the rank probe under compiled code over the same window (start -> peak), Inductor's "
             "buffers allocated where it sees them (`probes.compiled.inductor_buffers_dispatched`, as "
             "`distributed.rank` runs a compiled rank).", "",
             "| configuration | rank | loss (last stage) vs one process | grad diff | regions | frames / graphs | "
             "graph breaks | recompiles | first step (compile) | added, compiled | added, eager | probe start -> peak |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    failures = []
    for key in ranks[0]["configs"]:
        for rank in ranks:
            r = rank["configs"][key]
            if "error" in r:
                lines.append(f"| {key} | {rank['rank']} | failed (below) | | | | | | | | | |")
                failures.append(f"- `{key}`, rank {rank['rank']}: `{r['error']}`")
                continue
            loss = "" if r["loss"] is None else f"{r['loss']:.6f} vs {r['ref_loss']:.6f}"
            lines.append(f"| {key} | {rank['rank']} | {loss} | {r['grad_max_abs']:.1e} | {r['regions_compiled']} | "
                         f"{r['frames_ok']} / {r['unique_graphs']} | {r['graph_breaks']} | {r['recompiles']} | "
                         f"{r['compile_s']} s | {mib(r['allocator_fwd_bwd_added_bytes'])} | "
                         f"{mib(r['eager_allocator_fwd_bwd_added_bytes'])} | {mib(r['probe_fwd_bwd_start_bytes'])} -> "
                         f"{mib(r['probe_fwd_bwd_peak_bytes'])} |")
            if r["graph_breaks"]:
                failures.append(f"- `{key}`, rank {rank['rank']} broke the graph: {r['break_reasons'][0].splitlines()[0]}")
    return "\n".join(lines + ([""] + failures if failures else []) + [""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print the report instead of writing it")
    parser.add_argument("--tp", type=int, choices=sorted(REPORTS), default=1, help="tensor-parallel ranks inside each stage")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    ranks = measure(args.tp)
    report = REPORTS[args.tp]
    write_or_print(render(ranks, produced_by("spike_compiled_stages.py", load)), report, print_only=args.print)
    if not args.print:
        report.with_suffix(".json").write_text(json.dumps(ranks, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
