"""The scenarios of one reference share one timing pass (runner/timing_group.py): which ones group, and a run that
times the reference once per round for all of them, each ratio against the reference's steps of its round."""

from __future__ import annotations

import dataclasses

import torch

from pytest_flashckpt.config.run_options import Options
from pytest_flashckpt.config.axes import CompileConfig
from pytest_flashckpt.config.scenario import ActivationConfig, Scenario
from pytest_flashckpt.runner.context import RunContext
from pytest_flashckpt.runner.suite import SuiteRun, load_checked_suite
from pytest_flashckpt.runner.timing_group import group_of, timing_groups, timing_key


MICRO_CARD = "name: micro\nvocab_size: 64\nblock_size: 64\nn_layer: 2\nn_head: 2\nn_embd: 32\ndropout: 0.0\nbias: true\n"


def _scenario(name: str, strategy: str, seq_len: int = 32, rounds: int = 2, **kwargs) -> Scenario:
    return Scenario(name, model="tiny", batch_size=1, seq_len=seq_len, rounds=rounds, attention="eager",
                    activation=ActivationConfig(strategy, k=1), measure=("timing",), **kwargs)


def test_one_group_per_reference_step_rounds_and_steps() -> None:
    none, every, full = _scenario("none", "none"), _scenario("every", "every_k"), _scenario("full", "full")
    longer = _scenario("every-64", "every_k", seq_len=64)  # another reference
    more_rounds = _scenario("full-r3", "full", rounds=3)
    alone = _scenario("none-64", "none", seq_len=64)
    groups = timing_groups([none, every, full, longer, more_rounds, alone])
    assert [s.name for s in groups[timing_key(every)]] == ["none", "every", "full"]
    assert groups[timing_key(none)] is groups[timing_key(full)] or groups[timing_key(none)] == groups[timing_key(full)]
    assert [s.name for s in groups[timing_key(longer)]] == ["every-64", "none-64"]  # its reference is planned
    assert timing_key(more_rounds) not in groups  # the only scenario of 3 rounds: timed alone


def test_untimed_compiled_and_same_step_scenarios_do_not_add_members() -> None:
    every = _scenario("every", "every_k")
    untimed = dataclasses.replace(_scenario("full-mem", "full"), measure=("memory",))
    compiled = dataclasses.replace(_scenario("full-c", "full"), compile=CompileConfig(scope="block"))
    twin = dataclasses.replace(every, name="every-again", description="same step, another label")
    assert timing_groups([every, untimed, compiled, twin]) == {}  # one distinct timed step: nothing to share
    assert [s.name for s in timing_groups([every, twin, _scenario("full", "full")])[timing_key(every)]] == ["every", "full"]


def test_nothing_planned_or_a_gpu_times_each_scenario_alone() -> None:
    every, full = _scenario("every", "every_k"), _scenario("full", "full")
    ctx = RunContext(torch.device("cpu"), "cpu")
    assert group_of(ctx, every) is None  # nothing planned (the fixture, a single scenario)
    ctx.planned = (every, full)
    assert [s.name for s in group_of(ctx, every)] == ["every", "full"]
    gpu = RunContext(torch.device("cuda", 0), "cuda", planned=(every, full))
    assert group_of(gpu, every) is None


SUITE = """\
name: grouped
defaults: {{model: {card}, batch_size: 1, seq_len: 32, rounds: 3, steps: 1, attention: eager, measure: [timing]}}
scenarios:
  - name: none
  - name: every-k
    activation: {{strategy: every_k, k: 1}}
  - name: full
    activation: {{strategy: full}}
"""


def _run(tmp_path, plan: bool) -> dict[str, object]:
    card = tmp_path / "micro.yaml"
    card.write_text(MICRO_CARD, encoding="utf-8")
    (tmp_path / "grouped.yaml").write_text(SUITE.format(card=card), encoding="utf-8")
    suite = load_checked_suite(str(tmp_path / "grouped.yaml"))
    run = SuiteRun(suite, Options(suite="grouped.yaml", device="cpu", report="out", no_compare=True), tmp_path)
    if plan:
        run.plan(suite.scenarios)
    results = {}
    for scenario in suite.scenarios:
        result = run.step(scenario).result
        assert result.status == "measured", result.reason
        results[scenario.name] = result
    return results


def test_a_planned_run_times_the_reference_once_per_round_for_every_scenario(tmp_path) -> None:
    results = _run(tmp_path, plan=True)
    ref = results["none"].samples["step_time_s"]
    assert len(ref) == 3
    for name in ("every-k", "full"):
        own = results[name]
        assert own.samples["reference_step_time_s"] == ref  # the same rounds of the reference's steps
        assert len(own.samples["step_time_s"]) == 3
        ratios = [s / r for s, r in zip(own.samples["step_time_s"], ref)]
        assert own.samples["overhead"] == ratios  # each ratio against the reference's steps of its round
        assert any("one interleaved pass for the 3 scenarios" in n for n in own.notes), own.notes


def test_control_an_unplanned_run_times_the_reference_beside_each_scenario(tmp_path) -> None:
    results = _run(tmp_path, plan=False)
    every, full = results["every-k"].samples["reference_step_time_s"], results["full"].samples["reference_step_time_s"]
    assert every != full  # two passes, two sets of reference rounds
    assert not any("one interleaved pass" in n for r in results.values() for n in r.notes)
