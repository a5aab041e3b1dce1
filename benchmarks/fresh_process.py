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


def only_cases(doc: str | None, cases: dict) -> list[str] | None:
    """The case names of ``--only`` (repeatable, each one of ``cases``), or None when it is not given (every case,
    and the report is written rather than printed)."""
    import argparse

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=tuple(cases))
    return parser.parse_args().only


def alternating(names: list[str], ways: tuple, run) -> dict[str, dict]:
    """``run(name, way)`` for every way of every case, the ways one after the other and their order reversed from
    one case to the next, so a drift of the machine's load hits every way alike: ``{name: {way: result}}``."""
    results: dict[str, dict] = {}
    for index, name in enumerate(names):
        order = ways if index % 2 == 0 else ways[::-1]
        results[name] = {way: run(name, way) for way in order}
    return results
