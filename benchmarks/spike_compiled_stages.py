"""Spike for issue 32 item 7 (compiled pipeline stages): does a ``torch.distributed.pipelining`` rank train with every
block of its stages compiled (after the activation strategy, before ``fully_shard``: torchtitan's order), exactly,
without graph breaks or recompiles, and what does compile do to its forward + backward memory?

    python benchmarks/spike_compiled_stages.py           # 2 gloo ranks (pp 2), writes reports/spike-compiled-stages.md
    python benchmarks/spike_compiled_stages.py --print

The ranks run ``benchmarks/spike_compiled_stages_worker.py`` (what each configuration records: its docstring).
Recorded, not asserted.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from report_output import print_only_flag, produced_by, write_or_print  # noqa: E402
from spike_compiled_stages_worker import BATCH, CARD, SEQ  # noqa: E402

from pytest_flashckpt.distributed import launcher  # noqa: E402

REPORT = ROOT / "reports" / "spike-compiled-stages.md"
WORKER = ROOT / "benchmarks" / "spike_compiled_stages_worker.py"


def measure() -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        launcher.run(launcher.Launch(2, timeout_s=1800), str(WORKER), [str(out)], log_path=out / "launch.log")
        return [json.loads((out / f"rank-{r}.json").read_text(encoding="utf-8")) for r in (0, 1)]


def mib(n: int) -> str:
    return f"{n / 2**20:.3f} MiB"


def render(ranks: list[dict], provenance: str) -> str:
    lines = ["# Spike: compiled pipeline stages (issue 32 item 7)", "", provenance, "",
             f"pp 2 on 2 gloo ranks, a Llama card (`llama-tiny` with `{json.dumps(CARD)}`), fp32, batch {BATCH} x {SEQ}, "
             "every block of each stage compiled (Inductor, `compile.scope: block`). *grad diff*: the largest absolute "
             "difference of the rank's gradients from one eager process on the full batch (first step). *added*: "
             "the CPU allocator's forward + backward peak over its start, one step after two warm steps, compiled "
             "and eager; *probe*: the rank probe under compiled code over the same window (start -> peak).", "",
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
    print_only = print_only_flag(__doc__)
    load = os.getloadavg()[0]
    ranks = measure()
    write_or_print(render(ranks, produced_by("spike_compiled_stages.py", load)), REPORT, print_only=print_only)
    if not print_only:
        REPORT.with_suffix(".json").write_text(json.dumps(ranks, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
