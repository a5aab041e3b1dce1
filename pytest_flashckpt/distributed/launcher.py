"""Start the ranks of a scenario with ``torch.distributed.run`` (torchrun) and end them all, whatever happens.

One machine: ``python -m torch.distributed.run --standalone --nnodes 1 --nproc-per-node N -m <module> ...``:
torchrun's agent binds its c10d store to port 0, so the OS hands it a free port in the same call that takes it. (A
port found free beforehand and passed as ``--master-port`` can be taken in the seconds before torchrun binds it, by
gloo's own sockets in a launch running beside this one: the race a CI run of two pytest-xdist workers can hit.) Pass
``master_port`` to pin the port on one machine. Several machines: pass ``nnodes`` and
``master_addr``/``master_port`` (the same on every node), and a ``prefix`` that starts one torchrun
per node, e.g. ``["srun", "--nodes=2", "--ntasks-per-node=1"]`` or ``["mpirun", "-np", "2", "--map-by", "node"]``.
Several nodes rendezvous through torch's c10d store at ``master_addr:master_port`` (``--rdzv-backend c10d``), so
every node runs the identical command.

The launch runs in its own session: on a timeout (a rank that hangs), or when the caller is interrupted,
torchrun is stopped and every process below it (torchrun gives each rank its own session) and in its group is
killed, so no rank outlives the scenario. torchrun itself ends every rank when one
dies (``--max-restarts 0``), and the collectives' own timeout (``fsdp.init``) ends ranks stuck waiting for a peer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence


class LaunchError(RuntimeError):
    """The ranks did not all finish: a rank failed, died, or the launch timed out. ``log`` is the output tail; the
    message ends with its last ``SHOWN_LINES`` lines, so a failure in CI shows why without the log file."""

    SHOWN_LINES = 30

    def __init__(self, message: str, log: str = "") -> None:
        shown = "\n".join(log.rstrip().splitlines()[-self.SHOWN_LINES:])
        super().__init__(f"{message}\n--- last lines of the ranks' output ---\n{shown}" if shown else message)
        self.log = log


@dataclass
class Launch:
    """How to start the ranks; the defaults run every rank on this machine."""

    nproc_per_node: int
    nnodes: int = 1
    run_id: str = "flashckpt"  # several nodes: the rendezvous id, the same on every node
    master_addr: str = "127.0.0.1"
    master_port: int | None = None  # one node, None: torchrun --standalone binds a free port itself
    prefix: tuple[str, ...] = ()  # srun / mpirun command that starts torchrun on every node
    timeout_s: float = 600.0
    threads_per_rank: int = 1

    def command(self, module: str, args: Sequence[str]) -> list[str]:
        """The torchrun command line for ``module`` (a module name, or a script path ending in ``.py``)."""
        if self.nnodes > 1:
            if not self.master_port:
                raise ValueError("a launch over several nodes needs master_port: the same free port on the master node for every node")
            # c10d rendezvous: every node runs the same command (no node rank), as srun/mpirun start it
            rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{self.master_addr}:{self.master_port}", "--rdzv-id", self.run_id]
        elif self.master_port:
            rendezvous = ["--master-addr", self.master_addr, "--master-port", str(self.master_port)]
        else:
            rendezvous = ["--standalone"]
        return [
            *self.prefix,
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(self.nnodes), "--nproc-per-node", str(self.nproc_per_node), "--max-restarts", "0",
            *rendezvous, *([module] if module.endswith(".py") else ["-m", module]), *args,
        ]  # fmt: skip


def run(launch: Launch, module: str, args: Sequence[str], log_path: Path | None = None) -> float:
    """Run ``module`` on every rank; returns the wall time. Raises ``LaunchError`` (with the output tail) when any
    rank fails or the launch outlives ``launch.timeout_s``; no process of the launch is left running either way."""
    env = {**os.environ, "OMP_NUM_THREADS": str(launch.threads_per_rank), "PYTHONUNBUFFERED": "1"}
    env.pop("PYTEST_CURRENT_TEST", None)
    log_file = open(log_path, "w+b") if log_path else __import__("tempfile").TemporaryFile()
    start = time.perf_counter()
    with log_file:
        proc = subprocess.Popen(launch.command(module, args), stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=launch.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise LaunchError(
                f"{module} on {launch.nproc_per_node * launch.nnodes} ranks did not finish within {launch.timeout_s:.0f} s "
                "(a rank hangs); every rank was killed", _tail(log_file)
            ) from None
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            _kill_group(proc)  # a rank that survived its torchrun agent
        if rc != 0:
            raise LaunchError(f"{module} on {launch.nproc_per_node * launch.nnodes} ranks failed (torchrun exit status {rc})", _tail(log_file))
    return time.perf_counter() - start


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux ``/proc``; empty elsewhere). torchrun starts each rank in a new session,
    so killing the launch's process group alone would not reach the ranks."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_group(proc: subprocess.Popen) -> None:
    """End the launch: SIGTERM to torchrun (its agent stops the ranks it started), then SIGKILL to whatever is
    left of its process tree and process group."""
    tree = _descendants(proc.pid)
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _tail(log_file, limit: int = 6000) -> str:
    log_file.flush()
    log_file.seek(0)
    text = log_file.read().decode("utf-8", "replace")
    return text[-limit:]
