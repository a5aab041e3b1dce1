"""Step times of several compiled configurations measured side by side, each in a process of its own, in the same
interleaved rounds, and the paired verdict between two of them (issue 33 item 3: "never slower", measured side by
side, interleaved). ``compile_plan_sweep.py`` imports it as ``compile_duel``.

Why processes: every configuration compiles the same block code, and Dynamo's cache and compile's knob
(``activation_memory_budget``, read while a graph is partitioned) are per process. In one process the
configurations would share or evict each other's graphs (``torch._dynamo.reset()`` between them is why the sweep
measures one at a time). A worker per configuration keeps each one's graphs, so all of them run in one round:

    round r:   A B C ... (even r)   ... C B A (odd r)   one training step each, one at a time

Per round and worker, the step's wall time and the worker's process CPU time (waiting for a core inflates the first,
not the second). Every worker steps on the same CPU (``timing_cpu``). A comparison is the median of the per-round
ratios and its ~95% distribution-free interval (order statistics), so the noise of the machine at that moment cancels
in each ratio, and the interval says how finely the run resolved it.

What the interval does not hold is a bias per process: one configuration in two processes read up to 1.9% apart
over 40 rounds, pinned or not, in either direction (reports/compile-plan-sweep.md's controls). So a run's words are
read against its own floor (``floor_of``): the widest its controls (twin configurations) strayed from 1.0x. A ratio is
``faster`` or ``SLOWER`` only past that floor, and a run whose floor exceeds ``FLOOR_CAP`` claims nothing.

The worker side: ``python benchmarks/compile_duel.py --worker SPEC_JSON`` builds the model, compiles each block with
its policy (or leaves it eager), warms it up, then answers ``step`` on stdin with one JSON line per step and
``quit`` with the graphs compiled after the warm-up (a recompilation while timed) before it exits.
"""

from __future__ import annotations

import json
import math
import os
import select
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the smallest floor a run is read against, whatever its controls show (the controls' own intervals are ~1% wide)
MIN_FLOOR = 0.01
# a run whose controls stray further than this resolves no "not slower" worth stating: every word is "unresolved"
FLOOR_CAP = 0.05
# fewer rounds than this and the order-statistics interval covers less than 95% (n = 5: 94%, the whole range)
MIN_ROUNDS = 6
WORKER_START_TIMEOUT_S = 600.0  # a cold compile of every block on 2 cores
STEP_TIMEOUT_S = 300.0


def policy_spec(policies) -> list:
    """Per block ``None`` (no checkpoint) or the saved op keys of a ``SavePolicy``, as JSON."""
    return [None if p is None else sorted([name, k] for name, k in p.saved) for p in policies]


def median_interval(values: list[float]) -> tuple[float, float, float]:
    """The median and a ~95% distribution-free interval for it (order statistics n/2 -+ 0.98 sqrt(n))."""
    ordered, n = sorted(values), len(values)
    half = max(0, math.floor(0.98 * math.sqrt(n)))
    low, high = max(0, (n - 1) // 2 - half), min(n - 1, n // 2 + half)
    return statistics.median(ordered), ordered[low], ordered[high]


@dataclass
class Paired:
    """``a`` against ``b``: per-round ratios a / b, their median and ~95% interval, and the word for it."""

    ratios: list[float]
    median: float = field(init=False)
    low: float = field(init=False)
    high: float = field(init=False)

    def __post_init__(self) -> None:
        self.median, self.low, self.high = median_interval(self.ratios)

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def word(self, floor: float) -> str:
        """Read against the run's ``floor`` (``floor_of``): ``faster`` when the interval lies wholly below
        1 - floor; ``SLOWER`` when it lies wholly above 1 + floor; ``not slower`` when its top is within 1 + floor
        (slower by no more than the run resolves); ``unresolved`` otherwise (more rounds would tell), whenever
        fewer than ``MIN_ROUNDS`` rounds were run, and whenever the floor exceeds ``FLOOR_CAP``."""
        if len(self.ratios) < MIN_ROUNDS or floor > FLOOR_CAP:
            return "unresolved"
        if self.high < 1 - floor:
            return "faster"
        if self.low > 1 + floor:
            return "SLOWER"
        return "not slower" if self.high <= 1 + floor else "unresolved"

    @property
    def stray(self) -> float:
        """How far the interval reaches from 1.0x on its far side: what a control says about the method."""
        return max(self.high - 1, 1 - self.low)

    def text(self, floor: float) -> str:
        return f"{self.word(floor)} ({self.median:.3f}x, {self.low:.3f}-{self.high:.3f})"


def floor_of(controls: list[Paired]) -> float:
    """The run's floor: the furthest any control (one configuration in two processes, where the truth is 1.0x)
    reached from 1.0x, never below ``MIN_FLOOR``. Without controls the run has no measured floor: ``inf``, so
    every word reads ``unresolved``."""
    if not controls:
        return math.inf
    return max(MIN_FLOOR, *(c.stray for c in controls))


class Worker:
    """One configuration in a process of its own (the module docstring)."""

    def __init__(self, name: str, spec: dict) -> None:
        self.name = name
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.ready = self._reply(WORKER_START_TIMEOUT_S)

    def _reply(self, timeout: float) -> dict:
        assert self.proc.stdout is not None
        readable, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if readable else ""
        if not line:
            self.shut()
            raise RuntimeError(f"duel worker {self.name!r}: no reply (exit status {self.proc.poll()}); its stderr is above")
        return json.loads(line)

    def ask(self, command: str, timeout: float = STEP_TIMEOUT_S) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._reply(timeout)

    def close(self) -> dict:
        try:
            return self.ask("quit")
        finally:
            self.proc.wait(timeout=60)
            self.shut()

    def shut(self) -> None:
        """Kill the process if it still runs, and close its pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=60)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()


def timing_cpu() -> int:
    """The CPU every worker steps on: the last one this process may use. One CPU for all of them, so no
    configuration keeps a core of its own for the whole run (on a VM the vCPUs need not be equally fast, and a
    process tends to stay where it started)."""
    return max(os.sched_getaffinity(0))


def run_duel(specs: dict[str, dict], rounds: int, on_round=None) -> dict[str, dict]:
    """Every configuration of ``specs`` (name -> worker spec) stepped once per round, in alternating order, one at a
    time, every worker pinned to one CPU (``timing_cpu``) once it has compiled. Per name: ``wall`` and ``cpu``
    (per-round seconds), ``compile_s``, ``recompiles`` (graphs compiled while timed). Workers start one after
    another (each compiles on every core undisturbed)."""
    workers: list[Worker] = []
    cpu = timing_cpu()
    try:
        for name, spec in specs.items():
            workers.append(Worker(name, {**spec, "pin_cpu": cpu}))
        samples = {w.name: {"wall": [], "cpu": []} for w in workers}
        for r in range(rounds):
            if on_round is not None:
                on_round(r + 1, rounds)
            for w in workers if r % 2 == 0 else reversed(workers):
                reply = w.ask("step")
                samples[w.name]["wall"].append(reply["wall"])
                samples[w.name]["cpu"].append(reply["cpu"])
        for w in workers:
            samples[w.name].update(compile_s=w.ready["compile_s"], recompiles=w.close()["recompiles"])
        return samples
    finally:
        for w in workers:
            w.shut()


def paired(samples: dict[str, dict], a: str, b: str, key: str = "cpu") -> Paired:
    return Paired([x / y for x, y in zip(samples[a][key], samples[b][key])])


# ---- the worker -------------------------------------------------------------------------------------------------

def _worker(spec: dict) -> None:
    import torch
    from torch._dynamo.utils import counters

    from pytest_flashckpt.activation.budget.compile_policy import SavePolicy, compile_blocks
    from pytest_flashckpt.models.cards import build_model, load_card
    from pytest_flashckpt.training import Trainer

    torch.set_num_threads(spec.get("threads", 1))
    model = build_model(load_card(spec["card"]), "sdpa")
    if spec.get("policies") is not None:
        policies = [None if p is None else SavePolicy(frozenset((name, k) for name, k in p)) for p in spec["policies"]]
        compile_blocks(model, policies)
    trainer = Trainer.create(model, spec["batch"], spec["seq"])
    started = time.perf_counter()
    if spec.get("knob") is not None:
        torch._functorch.config.activation_memory_budget = spec["knob"]  # read while the first step partitions
    trainer.train_step()
    trainer.train_step()
    compile_s = time.perf_counter() - started
    graphs = counters["stats"]["unique_graphs"]
    if spec.get("pin_cpu") is not None:
        os.sched_setaffinity(0, {spec["pin_cpu"]})
    print(json.dumps({"compile_s": compile_s}), flush=True)
    for line in sys.stdin:
        if line.strip() == "step":
            wall0, cpu0 = time.perf_counter(), time.process_time()
            trainer.train_step()
            print(json.dumps({"wall": time.perf_counter() - wall0, "cpu": time.process_time() - cpu0}), flush=True)
        else:
            print(json.dumps({"recompiles": counters["stats"]["unique_graphs"] - graphs}), flush=True)
            return


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker(json.loads(sys.argv[2]))
    else:
        sys.exit(__doc__)
