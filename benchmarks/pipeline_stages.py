"""How long a simulated pipeline stage takes, and what it answers, for Llama-3-70B and Llama-3.1-405B (issue 32 item 2
and 6): the stage read off the depth line, the whole stage with the resize-tracking probe, and the whole stage with
the exact probe the gloo ranks use (the route before this change), which must all hold the same bytes.

    python benchmarks/pipeline_stages.py                 # every case, writes reports/pipeline-stages.md
    python benchmarks/pipeline_stages.py --only 70b-pp8  # those cases, prints the table (writes nothing)

Each way is one fresh process running ``python -m pytest_flashckpt.simulate.pipeline`` (the code behind
``flashckpt simulate --pp`` and ``flashckpt fit``'s pipeline candidates: torch's pipelining schedule + fully_shard
under FakeTensorMode, fake process group) with a timeout; the wall time includes the torch import, the CPU time is
the child's (user + system). Bytes are rank 0's (the first stage) live tensors, bf16 compute over float32 master
weights (mixed), full activation checkpointing, 1F1B.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from fresh_process import run_json  # benchmarks/ is first on sys.path when this file runs
from report_output import produced_by, write_or_print

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "reports" / "pipeline-stages.md"
# name -> (card, dp_shard, pp, microbatches, batch of the data-parallel group, seq, ways)
CASES = {
    "70b-pp8": ("llama3-70b", 8, 8, 8, 64, 8192, ("extrapolated", "whole", "whole-exact-probe")),
    "70b-pp4": ("llama3-70b", 16, 4, 8, 128, 8192, ("extrapolated", "whole")),
    "405b-pp8": ("llama3.1-405b", 8, 8, 8, 64, 8192, ("extrapolated", "whole")),
    # gradient accumulation inside the pipeline: 64 microbatches of one sequence, read off the microbatch line
    "70b-pp8-64mb": ("llama3-70b", 8, 8, 64, 512, 8192, ("extrapolated", "whole")),
}
WAYS = {"extrapolated": [], "whole": ["--no-extrapolate"], "whole-exact-probe": ["--no-extrapolate", "--exact-probe"]}
BYTES = ("peak_bytes", "fwd_bwd_start_bytes", "fwd_bwd_peak_bytes", "optimizer_start_bytes", "optimizer_peak_bytes")
TIMEOUT_S = 900


def command(name: str, way: str) -> list[str]:
    card, dp, pp, microbatches, batch, seq, _ = CASES[name]
    return ["-m", "pytest_flashckpt.simulate.pipeline", card, "--dp-shard", str(dp), "--pp", str(pp), "--schedule",
            "1f1b", "--microbatches", str(microbatches), "--batch", str(batch), "--seq", str(seq), "--strategy", "full",
            "--dtype", "bfloat16", "--precision", "mixed", "--ranks", "0", *WAYS[way]]


def run(name: str, way: str) -> dict:
    records, wall, cpu = run_json(command(name, way), timeout=TIMEOUT_S, label=f"{name} {way}")
    return {**records["0"], "wall_s": wall, "cpu_s": cpu}


def table(results: dict[str, dict[str, dict]]) -> list[str]:
    lines = ["| case | way | microbatches simulated | depths simulated | peak (B) | fwd+bwd start -> peak (B) "
             "| optimizer start -> peak (B) | same bytes as whole | wall (s) | CPU (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, ways in results.items():
        whole = ways.get("whole")
        for way, r in ways.items():
            same = "—" if whole is None or way == "whole" else (
                "yes" if all(r[k] == whole[k] for k in BYTES) else "**no**")
            lines.append(f"| {name} | {way} | {', '.join(map(str, r['simulated_microbatches']))} | "
                         f"{', '.join(map(str, r['simulated_depths']))} | {r['peak_bytes']:,} | "
                         f"{r['fwd_bwd_start_bytes']:,} -> {r['fwd_bwd_peak_bytes']:,} | {r['optimizer_start_bytes']:,} "
                         f"-> {r['optimizer_peak_bytes']:,} | {same} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=tuple(CASES))
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    results = {name: {way: run(name, way) for way in CASES[name][6]} for name in args.only or CASES}
    lines = [
        "# Pipeline stages simulated: depth and microbatch lines, resize-tracking probe, exact probe (issue 32 items 2, 6)", "",
        produced_by("pipeline_stages.py", load_before), "",
        "Each row is one fresh process: `python " + " ".join(command(next(iter(results)), "extrapolated")) + "` for the "
        "first case (see `benchmarks/pipeline_stages.py` for every case's options). Rank 0 (the first stage), 1F1B, "
        "full activation checkpointing, mixed precision. `extrapolated`: the stage read off the line through 1, 2, 3 "
        "blocks per stage, and a schedule of many microbatches off the line through a few smaller counts "
        "(`simulate.pipeline`, the default; the depths shown are those of the last microbatch count); `whole`: every block of the stage, the resize-tracking "
        "probe (`simulate.rank_probe`); `whole-exact-probe`: every block, the probe the gloo ranks use "
        "(`distributed.memory`: the route before this change).", "",
        *table(results), ""]
    write_or_print("\n".join(lines), REPORT, print_only=bool(args.only))


if __name__ == "__main__":
    main()
