"""Wall and CPU time of the project's default test run (docs/contributing.md "Tests"); writes reports/test-run-time.md.

    python benchmarks/time_test_run.py --runs 2 --one-process

Runs plain ``pytest`` (what README's test command runs: pytest-xdist workers, one per core, see tests/conftest.py)
``--runs`` times in this checkout, and with ``--one-process`` also ``pytest -n 0`` once, side by side in this job.
Records each run's wall time, the CPU time of pytest and every process it waited for (user + sys), the outcome
line and the number of workers, with the machine and the commit. Nothing is asserted: the 2-minute target on 2
cores is read off the table. Run it on a quiet machine: the numbers are this machine's at that hour.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTCOME = re.compile(r"=+ (.*? in [\d.]+s.*?) =+\s*$", re.M)
WORKERS = re.compile(r"created: (\d+)/\d+ workers")


def _run(args: list[str]) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = proc.stdout + proc.stderr
    outcome = OUTCOME.findall(out)
    workers = WORKERS.search(out)
    return {
        "command": " ".join(["pytest", *args]),
        "rc": proc.returncode,
        "wall_s": wall,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "workers": int(workers.group(1)) if workers else 1,
        "outcome": outcome[-1] if outcome else (out.strip().splitlines() or ["no output"])[-1],
    }


def _commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return head + (" (with uncommitted changes)" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="plain pytest runs (default 2)")
    parser.add_argument("--one-process", action="store_true", help="also run pytest -n 0 once, for the comparison")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "test-run-time.md")
    args = parser.parse_args()
    runs = [_run([]) for _ in range(args.runs)]
    if args.one_process:
        runs.append(_run(["-n", "0"]))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    import torch

    lines = [
        "# Default test run: wall and CPU time",
        "",
        f"Written by `python benchmarks/time_test_run.py {' '.join(sys.argv[1:])}`".rstrip() + " on "
        f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, commit {_commit()}.",
        f"Machine: {cores} cores ({platform.processor() or platform.machine()}), Python {platform.python_version()}, "
        f"torch {torch.__version__}. CPU time is pytest's and every process it waited for (user + sys).",
        "",
        "| command | workers | wall (s) | CPU (s) | exit | outcome |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for run in runs:
        lines.append(f"| `{run['command']}` | {run['workers']} | {run['wall_s']:.1f} | {run['cpu_s']:.1f} | {run['rc']} | "
                     f"{run['outcome']} |")
    lines += ["", "Plain `pytest` is README's test command (its first part; `pytest -m slow` runs after it in CI). "
              "`-n 0` is the same tests in one process.", ""]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    sys.exit(max(run["rc"] for run in runs))


if __name__ == "__main__":
    main()
