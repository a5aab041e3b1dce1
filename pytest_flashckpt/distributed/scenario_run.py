"""Run a scenario with ``world_size > 1``: its ranks under torchrun, then one ``Result`` from their records.

Its runner is ``runner.runners.DistributedRunner``. Multi-node and cluster launchers are set through the
environment, so suite files stay portable: ``FLASHCKPT_LAUNCH_PREFIX`` (e.g. ``"srun --nodes=2 --ntasks-per-node=1"``),
``FLASHCKPT_NNODES``, ``FLASHCKPT_MASTER_ADDR``/``FLASHCKPT_MASTER_PORT``, ``FLASHCKPT_DIST_TIMEOUT`` (seconds for the
whole launch; default 600). ``world_size`` is the number of ranks per node.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path

from pytest_flashckpt.config.scenario import Scenario
from pytest_flashckpt.config.typed import to_plain
from pytest_flashckpt.distributed import launcher
from pytest_flashckpt.distributed.aggregate import aggregate
from pytest_flashckpt.core.files import work_folder
from pytest_flashckpt.core.result import Result

RANK_MODULE = "pytest_flashckpt.distributed.rank"


def launch_from_env(world_size: int) -> launcher.Launch:
    env = os.environ
    return launcher.Launch(
        nproc_per_node=world_size,
        nnodes=int(env.get("FLASHCKPT_NNODES", "1")),
        master_addr=env.get("FLASHCKPT_MASTER_ADDR", "127.0.0.1"),
        master_port=int(env["FLASHCKPT_MASTER_PORT"]) if env.get("FLASHCKPT_MASTER_PORT") else None,
        prefix=tuple(shlex.split(env.get("FLASHCKPT_LAUNCH_PREFIX", ""))),
        timeout_s=float(env.get("FLASHCKPT_DIST_TIMEOUT", "600")),
    )


def run_distributed(scenario: Scenario, device: str, probe: str, workdir: Path | None = None) -> Result:
    """Launch ``scenario.world_size`` ranks, gather their ``rank-<r>.json`` records into a ``Result``. A failed or
    hung launch is an ``error`` result with torchrun's output tail in ``notes``; no rank is left running."""
    launch = launch_from_env(scenario.world_size)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    result = Result(scenario.suite, scenario.name, "measured", scenario, device=f"{device} x{scenario.world_size} ({backend})", probe=probe)
    with work_folder(workdir, "dist") as work:  # locked while it lives: a killed run's is removed by the next run
        spec = work / "scenario.json"
        spec.write_text(json.dumps(to_plain(scenario)), encoding="utf-8")
        args = ["--scenario", str(spec), "--out", str(work), "--checkpoints", str(work / "checkpoints"), "--probe", probe]
        start = time.perf_counter()
        try:
            launcher.run(launch, RANK_MODULE, args, log_path=work / "torchrun.log")
        except launcher.LaunchError as exc:
            records = [json.loads(p.read_text()) for p in sorted(work.glob("rank-*.json"))]
            failed = [r for r in records if r.get("status") == "error"]
            result.status = "error"
            result.reason = f"{exc}" + (f"; rank {failed[0]['rank']}: {failed[0]['reason']}" if failed else "")
            result.notes.append(exc.log)
            return result
        result.record("launch_wall_s", time.perf_counter() - start)
        records = [json.loads(p.read_text()) for p in sorted(work.glob("rank-*.json"))]
        if len(records) != scenario.world_size * launch.nnodes:
            result.status, result.reason = "error", f"{len(records)} of {scenario.world_size * launch.nnodes} ranks wrote their record"
            return result
        aggregate(result, records)
        return result
