"""Checks that need a fresh interpreter each (process-wide state: custom ops, a torchrun-free FSDP layout), started
together: one intra-op thread each, so on two cores their torch imports overlap instead of queueing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Hashable, Mapping, Sequence


def run_together(scripts: Mapping[Hashable, Sequence[str]], timeout: float = 300) -> dict:
    """``python *args`` for each entry at once; each must exit 0 and print its result as JSON on its last line.
    Returns the parsed results by the entry's key."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    running = {
        key: subprocess.Popen([sys.executable, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for key, args in scripts.items()
    }
    results = {}
    for key, proc in running.items():
        stdout, stderr = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"{key}: {stderr[-3000:]}"
        results[key] = json.loads(stdout.strip().splitlines()[-1])
    return results
