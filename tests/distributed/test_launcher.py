"""The torchrun launcher: command lines for one and several nodes, and no process left behind on a timeout."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from pytest_flashckpt.distributed import launcher


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_one_node_command_lets_torchrun_bind_a_free_port_and_never_restarts() -> None:
    cmd = launcher.Launch(2).command("pkg.mod", ["--x", "1"])
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--standalone" in cmd and "--master-port" not in cmd  # no port chosen here that another launch can take
    assert cmd[cmd.index("--nproc-per-node") + 1] == "2" and cmd[cmd.index("--max-restarts") + 1] == "0"
    pinned = launcher.Launch(2, master_port=29555).command("pkg.mod", [])
    assert pinned[pinned.index("--master-port") + 1] == "29555" and "--standalone" not in pinned
    assert cmd[-4:] == ["-m", "pkg.mod", "--x", "1"]
    assert launcher.Launch(2).command("worker.py", [])[-1] == "worker.py"  # a script runs as a path


def test_several_nodes_rendezvous_through_c10d_behind_a_launcher_prefix() -> None:
    launch = launcher.Launch(4, nnodes=2, master_addr="node0", master_port=29555, prefix=("srun", "--nodes=2"))
    cmd = launch.command("pkg.mod", [])
    assert cmd[:2] == ["srun", "--nodes=2"]
    assert cmd[cmd.index("--rdzv-endpoint") + 1] == "node0:29555" and cmd[cmd.index("--rdzv-backend") + 1] == "c10d"
    assert "--node-rank" not in cmd  # every node runs the same command
    with pytest.raises(ValueError, match="master_port"):
        launcher.Launch(4, nnodes=2).command("pkg.mod", [])


@pytest.mark.slow
def test_a_timeout_kills_every_process_of_the_launch(tmp_path, monkeypatch) -> None:
    pids = tmp_path / "pids"
    tree = f"sleep 300 & echo $! >> {pids}; sleep 300 & echo $! >> {pids}; echo $$ >> {pids}; wait"
    monkeypatch.setattr(launcher.Launch, "command", lambda self, module, args: ["sh", "-c", tree])
    # 1 s: the shell writes its three pids within milliseconds of its start, even on a loaded machine
    with pytest.raises(launcher.LaunchError, match="did not finish within 1 s .*every rank was killed"):
        launcher.run(launcher.Launch(2, timeout_s=1), "m", [])
    listed = [int(p) for p in pids.read_text().split()]
    assert len(listed) == 3
    deadline = time.monotonic() + 0.2  # dead within 0.2 s of the error, looked at as soon as they are
    while any(_alive(pid) for pid in listed) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(_alive(pid) for pid in listed)


@pytest.mark.distributed
@pytest.mark.slow
def test_a_hanging_rank_ends_the_launch_with_a_clear_error_and_no_leftover_rank(tmp_path) -> None:
    worker = Path(__file__).with_name("hang_worker.py")
    with pytest.raises(launcher.LaunchError, match="did not finish within 60 s") as failure:
        launcher.run(launcher.Launch(2, timeout_s=60), str(worker), [], log_path=tmp_path / "log")
    assert "rank 1 ready" in failure.value.log
    time.sleep(0.5)
    leftovers = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if str(worker).encode() in (proc / "cmdline").read_bytes() and _alive(int(proc.name)):
                    leftovers.append(proc.name)
            except OSError:
                pass
    assert leftovers == []


@pytest.mark.distributed
@pytest.mark.slow
def test_the_runner_sends_a_world_size_scenario_to_torchrun_ranks(tmp_path) -> None:
    import torch

    from pytest_flashckpt.config.scenario import ActivationConfig, SaveConfig, Scenario
    from pytest_flashckpt.runner.context import RunContext
    from pytest_flashckpt.runner.runners import measure_scenario

    card = tmp_path / "micro.yaml"
    card.write_text("name: micro\nvocab_size: 128\nblock_size: 64\nn_layer: 2\nn_head: 2\nn_embd: 32\n")
    scenario = Scenario(
        "micro", model=str(card), suite="t", world_size=2, batch_size=2, seq_len=32, rounds=2, attention="sdpa",
        activation=ActivationConfig(strategy="full"), save=SaveConfig(strategy="dcp", async_save=True, saves=2),
    )  # fmt: skip
    result = measure_scenario(scenario, RunContext(torch.device("cpu"), "cpu", workdir=tmp_path))
    assert result.status == "measured", (result.reason, result.notes)
    assert result.metrics["world_size"] == 2 and len(result.per_rank["peak_bytes"]) == 2
    assert result.metrics["roundtrip_differences"] == 0 and result.metrics["async_staged_bytes"] > 0
    assert "full on blocks 0, 1" in result.notes[0] and result.device == "cpu x2 (gloo)"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("flashckpt-work-dist-")]  # the launch's folder is gone


def test_a_failed_launch_says_why_in_its_message(monkeypatch) -> None:
    """CI prints the exception, not the log file: the message ends with the ranks' last lines."""
    lines = "; ".join(f"echo line {i}" for i in range(40))
    monkeypatch.setattr(launcher.Launch, "command", lambda self, module, args: ["sh", "-c", f"{lines}; echo Address already in use; exit 3"])
    with pytest.raises(launcher.LaunchError) as failure:
        launcher.run(launcher.Launch(2), "m", [])
    message = str(failure.value)
    assert "torchrun exit status 3" in message and message.endswith("Address already in use")
    assert "line 39" in message and "line 5\n" not in message  # the last 30 lines, not the whole log
    assert "line 0" in failure.value.log
