"""benchmarks/compile_duel.py: configurations timed side by side, a process each, and the paired verdict that
reports/compile-plan-sweep.md's "never slower" claims rest on (issue 33 item 3)."""

from __future__ import annotations

import importlib.util
import os
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("compile_duel", ROOT / "benchmarks" / "compile_duel.py")
duel = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("compile_duel", duel)  # its dataclass looks its module up there
_spec.loader.exec_module(duel)


def _noisy(centre: float, spread: float, n: int = 40) -> list[float]:
    """``n`` per-round ratios spread evenly over centre x (1 -+ spread), in a shuffled order (the median is centre)."""
    values = [centre * (1 + spread * (2 * i / (n - 1) - 1)) for i in range(n)] if n > 1 else [centre]
    random.Random(0).shuffle(values)
    return values


def test_the_word_follows_the_interval_against_the_floor() -> None:
    floor = 0.03
    assert duel.Paired(_noisy(0.90, 0.02)).word(floor) == "faster"
    assert duel.Paired(_noisy(1.10, 0.02)).word(floor) == "SLOWER"
    assert duel.Paired(_noisy(1.00, 0.02)).word(floor) == "not slower"
    # slower, or faster, by less than the floor (two processes of one configuration differ by that much)
    assert duel.Paired(_noisy(1.015, 0.01)).word(floor) == "not slower"
    assert duel.Paired(_noisy(0.985, 0.01)).word(floor) == "not slower"
    assert duel.Paired(_noisy(1.00, 0.40)).word(floor) == "unresolved"
    # a 5% slowdown inside 2% noise is told apart; inside 40% noise it is not claimed either way
    assert duel.Paired(_noisy(1.05, 0.02)).word(floor) == "SLOWER"
    assert duel.Paired(_noisy(1.05, 0.40)).word(floor) == "unresolved"
    # the same ratios read differently against a wider floor
    assert duel.Paired(_noisy(1.05, 0.02)).word(0.049) == "unresolved"
    # too few rounds for a 95% interval, or a floor past the cap: nothing is claimed, however clear the rounds look
    assert duel.Paired(_noisy(0.80, 0.01, n=duel.MIN_ROUNDS - 1)).word(floor) == "unresolved"
    assert duel.Paired(_noisy(0.80, 0.01, n=duel.MIN_ROUNDS)).word(floor) == "faster"
    assert duel.Paired(_noisy(0.80, 0.01)).word(duel.FLOOR_CAP + 0.001) == "unresolved"


def test_the_floor_is_the_furthest_a_control_strays() -> None:
    controls = [duel.Paired(_noisy(1.01, 0.01)), duel.Paired(_noisy(0.98, 0.01))]
    assert duel.floor_of(controls) == max(c.stray for c in controls) == pytest.approx(1 - controls[1].low)
    assert duel.floor_of([duel.Paired([1.0] * 10)]) == duel.MIN_FLOOR  # a perfect control still leaves the minimum
    assert duel.floor_of([]) == float("inf")  # no control, no floor: every word is unresolved


def test_the_interval_is_the_order_statistics_one() -> None:
    mid, low, high = duel.median_interval([float(i) for i in range(1, 41)])
    assert mid == 20.5 and (low, high) == (14.0, 27.0)  # n/2 -+ floor(0.98 sqrt(40)) = 6 places
    assert duel.median_interval([1.0]) == (1.0, 1.0, 1.0)


def test_a_policy_travels_to_the_worker_as_sorted_op_keys() -> None:
    from pytest_flashckpt.activation.budget.compile_policy import SavePolicy

    policy = SavePolicy(frozenset({("aten.mm.default", 2), ("aten.addmm.default", 0)}))
    assert duel.policy_spec([None, policy]) == [None, [["aten.addmm.default", 0], ["aten.mm.default", 2]]]


@pytest.mark.slow
def test_two_eager_workers_step_in_alternating_rounds_and_report_no_recompile() -> None:
    # two processes of the same eager configuration: the protocol end to end (ready, step, quit), ~10 s
    spec = {"card": "tiny", "batch": 1, "seq": 32, "knob": None, "threads": 1, "policies": None}
    samples = duel.run_duel({"a": spec, "b": spec}, rounds=4)
    assert duel.timing_cpu() in os.sched_getaffinity(0)
    assert set(samples) == {"a", "b"}
    for got in samples.values():
        assert len(got["wall"]) == len(got["cpu"]) == 4 and all(t > 0 for t in got["wall"])
        assert got["recompiles"] == 0 and got["compile_s"] > 0
    assert len(duel.paired(samples, "a", "b").ratios) == 4


def test_the_sweep_reads_its_plan_against_the_floor_its_twins_set() -> None:
    """compile_plan_sweep.judged on a made-up record: rows of one configuration (``fixed none``, ``knob 1`` and a
    plan that is ``none``) are controls and set the floor; a rival 10% slower than the plan reads ``faster``, a
    knob 2% faster reads ``not slower`` at a floor of ~3%, and the plan's own twin is never a rival."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import compile_plan_sweep as sweep
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    rounds = 40
    noise = [1 + 0.01 * ((i * 7) % 5 - 2) for i in range(rounds)]  # the same per-round noise for every worker
    cpu = {"plan": [0.1 * n for n in noise], "fixed none": [0.1 * n for n in noise],
           "knob 1": [0.103 * n for n in noise], "fixed full": [0.11 * n for n in noise], "knob 0": [0.098 * n for n in noise]}
    none = {"blocks": ["none", "none"], "knob": None}
    rows = [{"config": "fixed none", "family": "fixed", "peak_bytes": 100, **none},
            {"config": "fixed full", "family": "fixed", "peak_bytes": 50, "blocks": ["full", "full"], "knob": None},
            {"config": "knob 1", "family": "knob", "peak_bytes": 100, "blocks": ["none", "none"], "knob": 1.0},
            {"config": "knob 0", "family": "knob", "peak_bytes": 50, "blocks": ["none", "none"], "knob": 0.0},
            {"config": "plan", "family": "plan", "peak_bytes": 100, "budget_bytes": 120, **none}]
    for row in rows:
        row.update(cpu_ratio=1.0, cpu_ratio_interval=[1.0, 1.0])
    record = sweep.judged({"cards": [{"card": "c", "rows": rows, "timing": {"samples": {k: {"cpu": v} for k, v in cpu.items()}}}]})
    assert len(record["controls"]) == 6  # three rows of one configuration, paired both ways
    assert record["floor"] == pytest.approx(0.03, abs=0.005)  # knob 1 read 3% off its twins
    (verdict,) = record["verdicts"]
    assert {p["against"] for p in verdict["twin"]} == {"fixed none", "knob 1"}
    assert [(p["against"], p["word"]) for p in verdict["vs_fixed"]] == [("fixed full", "faster")]
    assert [(p["against"], p["word"]) for p in verdict["vs_knob"]] == [("knob 0", "not slower")]
    assert (verdict["fixed_word"], verdict["knob_word"]) == ("faster", "not slower")
