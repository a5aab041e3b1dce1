"""``flashckpt fit`` on Llama-3-70B (and Llama-3.1-405B where its card exists, at 8K and 128K tokens): the ranked
layouts, and how long the search takes on this machine.

    python benchmarks/fit_layouts.py                 # every case whose card exists, writes reports/fit-<case>.md
    python benchmarks/fit_layouts.py --only llama3-70b --print   # prints the report (writes nothing)
    python benchmarks/fit_layouts.py --only llama3-70b-64gpu     # the short run: 64 GPUs, full AC, 2 simulations

Each case is one fresh process running the ``flashckpt fit`` command (``python -m pytest_flashckpt.cli fit ...``)
with a timeout; its wall time includes the torch import and every rank simulation (the real engine under fake
mode, ``simulate.fake_ranks``), which is what dominates on deep cards. The arguments keep the search to the
strategies torchtitan runs for these models (full and selective activation checkpointing) and to a few
simulations per GPU count, so the benchmark finishes on a shared 2-core machine; the load average is printed.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

from report_output import write_or_print  # benchmarks/ is first on sys.path when this file runs

from pytest_flashckpt.runner.profile import cpu_name

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["--seq", "8192", "--device", "h100-sxm", "--device-memory", "80GiB", "--precision", "both",
          "--strategies", "full,selective_op", "--top", "2", "--max-simulations", "12"]
CASES = {
    "llama3-70b": ["--model", "llama3-70b", "--global-batch-tokens", "1048576", "--gpus", "8,16,64", *COMMON],
    "llama3.1-405b": ["--model", "llama3.1-405b", "--global-batch-tokens", "2097152", "--gpus", "64,128", *COMMON],
    # 128K tokens: context parallel (with FSDP over dp_shard x cp and tp) against pipeline and plain FSDP layouts
    "llama3.1-405b-128k": ["--model", "llama3.1-405b", "--global-batch-tokens", "2097152", "--gpus", "64,128,256",
                           "--seq", "131072", "--device", "h100-sxm", "--device-memory", "80GiB", "--precision",
                           "both", "--strategies", "full", "--top", "3", "--max-simulations", "32"],
    # one GPU count, one strategy, two simulations: the short run for a loaded machine
    "llama3-70b-64gpu": ["--model", "llama3-70b", "--global-batch-tokens", "1048576", "--gpus", "64", "--seq", "8192",
                         "--device", "h100-sxm", "--device-memory", "80GiB", "--strategies", "full", "--top", "1",
                         "--max-simulations", "2"],
}
DEFAULT_CASES = ("llama3-70b", "llama3.1-405b", "llama3.1-405b-128k")
TIMEOUT_S = 3600


def card_exists(case: str) -> bool:
    card = CASES[case][CASES[case].index("--model") + 1]
    return (ROOT / "models" / f"{card}.yaml").is_file()


def run_case(name: str) -> str:
    args = ["-m", "pytest_flashckpt.cli", "fit", *CASES[name]]
    command = "flashckpt fit " + shlex.join(CASES[name])
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        status, output = f"exit status {done.returncode}", (done.stdout + done.stderr).rstrip()
    except subprocess.TimeoutExpired as exc:  # what it printed so far is still the answer's progress
        status = f"stopped after the {TIMEOUT_S} s timeout"
        output = "\n".join(part.decode() if isinstance(part, bytes) else part for part in (exc.stdout, exc.stderr) if part)
    wall = time.perf_counter() - started
    import torch

    return "\n".join([
        f"# flashckpt fit: {name} (issue 32 item 5)", "",
        f"Produced by `python benchmarks/fit_layouts.py --only {name}` on {platform.node()} ({os.cpu_count()} cores of {cpu_name()}, "
        f"shared), torch {torch.__version__}; load average (1 min) before / after: {load_before:.2f} / "
        f"{os.getloadavg()[0]:.2f}.", "",
        f"Command: `{command}`; {status}; wall time {wall:.0f} s (torch import and every rank "
        "simulation included).", "",
        "Its output (progress lines, then the table of fitting layouts and the per-GPU-count summary):", "",
        "```text", output, "```", "",
        "How to read it: docs/fit.md. The per-rank peaks are simulated by the real engine under fake mode (plus the "
        "modelled additions named beside them); step times, tokens/s and MFU are the time model's predictions at "
        "the stated MFU assumption, not measurements.", ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=tuple(CASES))
    parser.add_argument("--print", action="store_true", help="print the report instead of writing it")
    args = parser.parse_args()
    for name in args.only or DEFAULT_CASES:
        if not card_exists(name):
            print(f"{name}: its model card is not in models/ on this checkout; skipped")
            continue
        write_or_print(run_case(name), ROOT / "reports" / f"fit-{name}.md", print_only=args.print)


if __name__ == "__main__":
    main()
