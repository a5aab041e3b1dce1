"""A pipeline candidate's first and last rank simulated one after the other and side by side
(``simulate.pipeline.simulate_side_by_side``, what ``flashckpt fit`` does on two cores), and that both answer the
same bytes (issue 32 item 6: a search over layouts in minutes).

    python benchmarks/side_by_side_ranks.py                     # every case, writes reports/side-by-side-ranks.md
    python benchmarks/side_by_side_ranks.py --only 70b-pp8-1f1b # those cases, prints the table (writes nothing)

Each way of each case is one fresh process (``python -m pytest_flashckpt.simulate.pipeline ... --ranks 0,LAST``, the
code behind ``flashckpt fit``'s pipeline candidates) with ``--jobs 1`` or ``--jobs 2``; the two ways of a case run
one after the other, the order alternating from case to case, so a drift of the machine's load hits both alike.
The wall time includes the torch import (and, side by side, the spawned process's); the CPU time is the children's
(user + system).
"""

from __future__ import annotations

import os
from pathlib import Path

from fresh_process import alternating, only_cases, run_json  # benchmarks/ is first on sys.path when this file runs
from report_output import produced_by, write_or_print

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "reports" / "side-by-side-ranks.md"
BYTES = ("peak_bytes", "fwd_bwd_start_bytes", "fwd_bwd_peak_bytes", "optimizer_start_bytes", "optimizer_peak_bytes")
TIMEOUT_S = 1200
PIPELINE = ["-m", "pytest_flashckpt.simulate.pipeline"]
# name -> (what it is, the simulation's command line after ``python``, without --jobs)
CASES = {
    "70b-pp8-1f1b": ("Llama-3-70B, FSDP 8 x PP 8, 1F1B over 8 microbatches, 64 x 8192, mixed, full; depth line",
                     [*PIPELINE, "llama3-70b", "--dp-shard", "8", "--pp", "8", "--schedule", "1f1b", "--microbatches",
                      "8", "--batch", "64", "--seq", "8192", "--strategy", "full", "--dtype", "bfloat16",
                      "--precision", "mixed", "--ranks", "0,56"]),
    "70b-pp8-interleaved": ("Llama-3-70B, PP 8, interleaved 1F1B (2 stages per rank) over 32 microbatches, 32 x 8192, "
                            "bf16, selective_op (a flashckpt fit candidate's sample)",
                            [*PIPELINE, "llama3-70b", "--pp", "8", "--schedule", "interleaved_1f1b", "--stages-per-rank",
                             "2", "--microbatches", "32", "--batch", "32", "--seq", "8192", "--strategy",
                             "selective_op", "--dtype", "bfloat16", "--ranks", "0,7"]),
    "tiny-pp2": ("llama-tiny, PP 2, 1F1B over 4 microbatches, 4 x 64, fp32, full (a card where the process start "
                 "is most of the time)",
                 [*PIPELINE, "llama-tiny", "--pp", "2", "--schedule", "1f1b", "--microbatches", "4", "--batch", "4",
                  "--seq", "64", "--strategy", "full", "--ranks", "0,1"]),
}
JOBS = (1, 2)


def run(name: str, jobs: int) -> dict:
    records, wall, cpu = run_json([*CASES[name][1], "--jobs", str(jobs)], timeout=TIMEOUT_S, label=f"{name} jobs {jobs}")
    return {"records": records, "wall_s": wall, "cpu_s": cpu}


def table(results: dict[str, dict[int, dict]]) -> list[str]:
    lines = ["| case | jobs | process wall s | CPU s | wall side by side / one after the other | rank: peak (B) | "
             "every window of both ranks equal to the byte |",
             "|---|---|---|---|---|---|---|"]
    for name, ways in results.items():
        alone = ways[1]
        for jobs in JOBS:
            r = ways[jobs]
            same = "—" if jobs == 1 else ("yes" if all(
                r["records"][rank][k] == alone["records"][rank][k] for rank in alone["records"] for k in BYTES)
                else "**no**")
            ratio = "" if jobs == 1 else f"{r['wall_s'] / alone['wall_s']:.2f}"
            peaks = ", ".join(f"{rank}: {rec['peak_bytes']:,}" for rank, rec in r["records"].items())
            lines.append(f"| {name} | {jobs} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {ratio} | {peaks} | {same} |")
    return lines


def main() -> None:
    only = only_cases(__doc__, CASES)
    names = only or list(CASES)
    load_before = os.getloadavg()[0]
    results = alternating(names, JOBS, run)
    lines = [
        "# A pipeline candidate's two ranks, one after the other and side by side: time and bytes (issue 32 item 6)", "",
        produced_by("side_by_side_ranks.py", load_before), "",
        "`jobs 1`: the first and the last pipeline rank simulated one after the other in one process; `jobs 2`: the "
        "last rank in a spawned process while the first runs (`simulate.pipeline.simulate_side_by_side`, what "
        "`flashckpt fit` does where it may use two cores; docs/layouts.md). Each row is one fresh process. Cases:", "",
        *(f"- `{name}`: {CASES[name][0]}: `python {' '.join(CASES[name][1])} --jobs 2`" for name in results), "",
        *table(results), ""]
    write_or_print("\n".join(lines), REPORT, print_only=only is not None)


if __name__ == "__main__":
    main()
