"""Confirmation rounds (runner/confirm.py): a timing pass whose first look reads slower than the baseline gets more
rounds before it is judged; one that reads as the baseline, or has nothing to compare with, does not."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from pytest_flashckpt.baselines import Baseline, Gate, Thresholds
from pytest_flashckpt.config.run_options import Options
from pytest_flashckpt.config.scenario import ActivationConfig, Scenario
from pytest_flashckpt.config.suites import Suite
from pytest_flashckpt.core.result import Result
from pytest_flashckpt.runner.context import RunContext
from pytest_flashckpt.runner.passes import timing_pass
from pytest_flashckpt.runner.run import run_scenario
from pytest_flashckpt.runner.suite import SuiteRun

CPU = torch.device("cpu")
MICRO_CARD = "name: micro\nvocab_size: 64\nblock_size: 64\nn_layer: 2\nn_head: 2\nn_embd: 32\ndropout: 0.0\nbias: true\n"
SCENARIO = Scenario("a", suite="mini", activation=ActivationConfig("every_k", k=2), seq_len=256)
BASELINE_OVERHEAD = [1.10, 1.11, 1.09, 1.12, 1.10, 1.08, 1.11, 1.10, 1.09, 1.12, 1.10, 1.11, 1.09, 1.10, 1.11, 1.10, 1.12, 1.09, 1.10, 1.11]


def _gate(tmp_path: Path, scenario: Scenario = SCENARIO) -> Gate:
    stored = Result("mini", scenario.name, "measured", scenario, probe="cpu")
    stored.record("overhead", 1.10, samples=BASELINE_OVERHEAD)
    baseline = Baseline("p", {})
    baseline.update([stored], None, "t")
    baseline.write(tmp_path / "p.json")
    return Gate(tmp_path, "p", Thresholds())


def _now(scenario: Scenario = SCENARIO) -> Result:
    return Result("mini", scenario.name, "measured", scenario, probe="cpu")


def test_a_first_look_slower_than_the_baseline_asks_for_confirmation(tmp_path):
    gate = _gate(tmp_path)
    row = gate.first_look(_now(), "overhead", [1.30, 1.28, 1.32])
    assert row is not None and row.metric == "overhead" and row.change > 0.10  # overhead's tolerance: its run drift
    # one slower round of three is a burst, not a slower first look... but a median beyond the tolerance is
    assert gate.first_look(_now(), "overhead", [1.10, 1.60, 1.25]) is not None
    assert gate.verdicts == [] and gate.notes == []  # nothing recorded: the scenario is judged once, later


def test_control_a_first_look_like_the_baseline_or_faster_asks_for_none(tmp_path):
    gate = _gate(tmp_path)
    assert gate.first_look(_now(), "overhead", [1.10, 1.11, 1.09]) is None
    assert gate.first_look(_now(), "overhead", [0.90, 0.92, 0.91]) is None  # improved: nothing to confirm
    assert gate.first_look(_now(), "overhead", []) is None


def test_nothing_to_compare_with_asks_for_none(tmp_path):
    gate = _gate(tmp_path)
    other = dataclasses.replace(SCENARIO, name="b")
    assert gate.first_look(_now(other), "overhead", [1.5, 1.5, 1.5]) is None  # not in the baseline
    changed = dataclasses.replace(SCENARIO, activation=ActivationConfig("every_k", k=3))
    assert gate.first_look(_now(changed), "overhead", [1.5, 1.5, 1.5]) is None  # not comparable
    assert Gate(tmp_path / "none", "p", Thresholds()).first_look(_now(), "overhead", [1.5, 1.5, 1.5]) is None


def test_added_rounds_go_on_with_the_alternation_and_see_the_first_look():
    calls: list[str] = []
    seen: list[list[float]] = []

    def ask(samples: list[float]) -> int:
        seen.append(samples)
        return 3

    timing = timing_pass(lambda: calls.append("B"), lambda: calls.append("A"), 2, 1, CPU, more_rounds=ask)
    assert calls == ["A", "B", "B", "A", "A", "B", "B", "A", "A", "B"]  # rounds 1-2, then 3-5 alternating on
    assert len(seen) == 1 and len(seen[0]) == 2  # asked once, with the first look's two ratios
    assert len(timing.step_s) == len(timing.reference_s) == 5 and timing.confirmation_rounds == 3
    assert timing.measurements()["confirmation_rounds"] == 3


def test_control_none_asked_or_none_wanted_runs_the_rounds_alone():
    calls: list[str] = []
    timing = timing_pass(lambda: calls.append("B"), lambda: calls.append("A"), 2, 1, CPU, more_rounds=lambda s: 0)
    assert len(calls) == 4 and timing.confirmation_rounds == 0
    assert "confirmation_rounds" not in timing.measurements()
    plain = timing_pass(lambda: None, None, 2, 1, CPU, more_rounds=lambda s: 3)  # no reference: no ratio to judge
    assert len(plain.step_s) == 2


def test_a_scenario_run_asks_its_context_and_says_so(tmp_path):
    (tmp_path / "micro.yaml").write_text(MICRO_CARD, encoding="utf-8")
    scenario = Scenario("k", model=str(tmp_path / "micro.yaml"), batch_size=1, seq_len=32, rounds=2, attention="eager",
                        activation=ActivationConfig("every_k", k=1), measure=("timing",))
    asked: list[tuple[str, int]] = []
    for wanted in (3, 0):
        ctx = RunContext(CPU, "cpu")
        ctx.more_rounds = lambda result, samples, wanted=wanted: asked.append((result.id, len(samples))) or wanted
        result = run_scenario(scenario, ctx)
        assert result.status == "measured", result.reason
        assert len(result.samples["overhead"]) == 2 + wanted
        assert result.metrics.get("confirmation_rounds") == (wanted or None)
        assert any("confirmation rounds" in n for n in result.notes) == bool(wanted)
    assert asked == [("::k", 2), ("::k", 2)]  # asked once per run, about its own result


def _suite_run(tmp_path: Path, **options) -> SuiteRun:
    suite = Suite("mini", "", tmp_path / "mini.yaml", (SCENARIO,))
    return SuiteRun(suite, Options(suite="mini", device="cpu", baseline_dir="b", **options), root=tmp_path)


def test_the_suite_run_asks_its_gate_unless_the_baseline_is_refreshed_or_off(tmp_path):
    run = _suite_run(tmp_path)
    (tmp_path / "b").mkdir()
    _gate(tmp_path / "b")
    (tmp_path / "b" / "p.json").rename(tmp_path / "b" / f"{run.context.profile()[1]}.json")
    assert run.context.more_rounds is not None
    assert run.confirmation_rounds(_now(), [1.30, 1.31, 1.29]) == 5
    assert run.confirmation_rounds(_now(), [1.10, 1.10, 1.11]) == 0
    assert _suite_run(tmp_path, confirm_rounds=2).confirmation_rounds(_now(), [1.30, 1.31, 1.29]) == 2
    for off in ({"confirm_rounds": 0}, {"save_baseline": True}, {"no_compare": True}):
        assert _suite_run(tmp_path, **off).context.more_rounds is None, off


def test_a_pooled_baseline_is_looked_at_against_its_envelope():
    """Against a baseline of two runs the first look is the envelope's judgement (``judge_across_runs``): a first
    look inside the envelope (above the lower run, within the tolerance of the higher) asks for nothing."""
    from pytest_flashckpt.baselines.entry import BaselineEntry
    from pytest_flashckpt.baselines.gate import first_look

    low, high = BASELINE_OVERHEAD, [v * 1.06 for v in BASELINE_OVERHEAD]
    stored = BaselineEntry.from_dict({
        "metrics": {"overhead": 1.13}, "samples": {"overhead": low + high}, "probe": "cpu",
        "runs": [{"label": "a", "created": "t", "commit": None, "samples": {"overhead": low}},
                 {"label": "b", "created": "t", "commit": None, "samples": {"overhead": high}}]})
    assert first_look(stored, _now(), "overhead", [1.24, 1.23, 1.25], Thresholds()) is None  # inside: one run would flag it
    one_run = BaselineEntry.from_dict({"metrics": {"overhead": 1.10}, "samples": {"overhead": low}, "probe": "cpu"})
    assert first_look(one_run, _now(), "overhead", [1.24, 1.23, 1.25], Thresholds()) is not None  # control
    row = first_look(stored, _now(), "overhead", [1.40, 1.38, 1.42], Thresholds())  # beyond the higher run
    assert row is not None and row.verdict in ("regressed", "~")
