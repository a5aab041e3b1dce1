"""How long a simulated rank takes with a real warm step and primed (``simulate.fake_ranks.warm_up``), and that both
answer the same bytes (issue 32 item 6: a search over layouts in minutes).

    python benchmarks/warm_up_speed.py                   # every case, writes reports/warm-up-speed.md
    python benchmarks/warm_up_speed.py --only 70b-fsdp8  # those cases, prints the table (writes nothing)

Each way of each case is one fresh process (``python -m pytest_flashckpt.simulate.fake_ranks`` for an FSDP / TP rank,
``python -m pytest_flashckpt.simulate.pipeline`` for a pipeline rank: the code behind ``flashckpt simulate`` and
``flashckpt fit``) with ``--warmup step`` or ``--warmup primed``; the two ways of a case run one after the other, the
order alternating from case to case, so a drift of the machine's load hits both alike. The wall time includes the
torch import; the CPU time is the child's (user + system).
"""

from __future__ import annotations

import os
from pathlib import Path

from fresh_process import alternating, only_cases, run_json  # benchmarks/ is first on sys.path when this file runs
from report_output import produced_by, write_or_print

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "reports" / "warm-up-speed.md"
BYTES = ("peak_bytes", "fwd_bwd_start_bytes", "fwd_bwd_peak_bytes", "optimizer_start_bytes", "optimizer_peak_bytes")
TIMEOUT_S = 900
# name -> (what it is, the simulation's command line after ``python``)
CASES = {
    "70b-fsdp8": ("Llama-3-70B, FSDP 8, 8 x 8192, bf16, full; depth line 3, 4, 5",
                  ["-m", "pytest_flashckpt.simulate.fake_ranks", "llama3-70b", "--layouts", "8x1", "--batch", "8",
                   "--seq", "8192", "--strategies", "full", "--dtype", "bfloat16", "--foreach"]),
    "405b-fsdp8-tp8": ("Llama-3.1-405B, FSDP 8 x TP 8, 8 x 8192, bf16, full; depth line",
                       ["-m", "pytest_flashckpt.simulate.fake_ranks", "llama3.1-405b", "--layouts", "8x8", "--batch",
                        "8", "--seq", "8192", "--strategies", "full", "--dtype", "bfloat16", "--foreach"]),
    "70b-pp8-1f1b": ("Llama-3-70B, FSDP 8 x PP 8, 1F1B over 8 microbatches, 64 x 8192, mixed, full, first rank; "
                     "depth line",
                     ["-m", "pytest_flashckpt.simulate.pipeline", "llama3-70b", "--dp-shard", "8", "--pp", "8",
                      "--schedule", "1f1b", "--microbatches", "8", "--batch", "64", "--seq", "8192", "--strategy",
                      "full", "--dtype", "bfloat16", "--precision", "mixed", "--ranks", "0"]),
    "70b-pp8-interleaved": ("Llama-3-70B, PP 8, interleaved 1F1B (2 stages per rank) over 32 microbatches, 32 x 8192, "
                            "bf16, selective_op, first rank; whole (a flashckpt fit candidate's sample)",
                            ["-m", "pytest_flashckpt.simulate.pipeline", "llama3-70b", "--pp", "8", "--schedule",
                             "interleaved_1f1b", "--stages-per-rank", "2", "--microbatches", "32", "--batch", "32",
                             "--seq", "8192", "--strategy", "selective_op", "--dtype", "bfloat16", "--ranks", "0"]),
}
WAYS = ("step", "primed")


def run(name: str, way: str) -> dict:
    record, wall, cpu = run_json([*CASES[name][1], "--warmup", way], timeout=TIMEOUT_S, label=f"{name} {way}")
    while "peak_bytes" not in record:  # {layout: {strategy: record}} or {rank: record}: the one record inside
        record = next(iter(record.values()))
    return {**record, "wall_s": wall, "cpu_s": cpu}


def table(results: dict[str, dict[str, dict]]) -> list[str]:
    lines = ["| case | warm-up | warm-up s | measured step s | process wall s | CPU s | CPU primed / step | "
             "peak (B) | every window equal to the byte |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, ways in results.items():
        step = ways["step"]
        for way in WAYS:
            r = ways[way]
            same = "—" if way == "step" else ("yes" if all(r[k] == step[k] for k in BYTES) else "**no**")
            ratio = "" if way == "step" else f"{r['cpu_s'] / step['cpu_s']:.2f}"
            lines.append(f"| {name} | {way} | {r['warm_step_s']:.1f} | {r['measured_step_s']:.1f} | {r['wall_s']:.1f} | "
                         f"{r['cpu_s']:.1f} | {ratio} | {r['peak_bytes']:,} | {same} |")
    return lines


def main() -> None:
    only = only_cases(__doc__, CASES)
    names = only or list(CASES)
    load_before = os.getloadavg()[0]
    results = alternating(names, WAYS, run)
    lines = [
        "# A simulated rank with a real warm step and primed: time and bytes (issue 32 item 6)", "",
        produced_by("warm_up_speed.py", load_before), "",
        "`step`: the rank runs a first training step before the measured one (the route before this change); "
        "`primed`: zero gradients, one optimizer step and the schedule's stage initialisation instead "
        "(`simulate.fake_ranks.warm_up`, docs/layouts.md). `warm-up s` and `measured step s` are summed over the "
        "depths a line simulated; each row is one fresh process. Cases:", "",
        *(f"- `{name}`: {CASES[name][0]}: `python {' '.join(CASES[name][1])} --warmup primed`" for name in results), "",
        *table(results), ""]
    write_or_print("\n".join(lines), REPORT, print_only=only is not None)


if __name__ == "__main__":
    main()
