"""A simulation run in a fresh Python process from the repository root, as the benchmarks that time one need it: its
wall time (torch import included), its CPU time (the child's user + system) and the JSON its last stdout line
holds. A benchmark run as ``python benchmarks/<name>.py`` imports it as ``fresh_process``."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_json(args: list[str], *, timeout: float, label: str) -> tuple[object, float, float]:
    """``python *args`` in a fresh process: (its last stdout line as JSON, wall s, CPU s); ``SystemExit`` naming
    ``label`` with the stderr tail when it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{label}: exit status {done.returncode}\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(done.stdout.strip().splitlines()[-1]), wall, cpu
