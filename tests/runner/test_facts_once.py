"""One scenario's path computes each fact once: its reference scenario (each ``reference()`` re-validates a
whole scenario) and the analytic estimate of its strategy."""

from __future__ import annotations

import torch

from pytest_flashckpt.activation import analytic
from pytest_flashckpt.config.scenario import ActivationConfig, Scenario
from pytest_flashckpt.runner.context import RunContext
from pytest_flashckpt.runner.run import run_scenario


MICRO_CARD = "name: micro\nvocab_size: 64\nblock_size: 64\nn_layer: 2\nn_head: 2\nn_embd: 32\ndropout: 0.0\nbias: true\n"


def test_the_reference_and_the_estimate_are_computed_once(monkeypatch, tmp_path) -> None:
    calls = {"reference": 0, "estimate": []}
    reference, estimate = Scenario.reference, analytic.estimate

    def counted_reference(self):
        calls["reference"] += 1
        return reference(self)

    def counted_estimate(config, work, strategy, *args, **kwargs):
        calls["estimate"].append(strategy)
        return estimate(config, work, strategy, *args, **kwargs)

    monkeypatch.setattr(Scenario, "reference", counted_reference)
    monkeypatch.setattr(analytic, "estimate", counted_estimate)
    (tmp_path / "micro.yaml").write_text(MICRO_CARD, encoding="utf-8")
    scenario = Scenario("k", model=str(tmp_path / "micro.yaml"), batch_size=1, seq_len=32, rounds=1, attention="eager",
                        activation=ActivationConfig("every_k", k=1), measure=("memory", "flops"))
    result = run_scenario(scenario, RunContext(torch.device("cpu"), "cpu"))
    assert result.status == "measured", result.reason
    assert {"memory_saving", "flop_ratio", "analytic_memory_saving"} <= set(result.metrics)  # the passes that use them ran
    assert calls["reference"] == 1
    assert sorted(calls["estimate"]) == ["every_k", "none"]  # the strategy's once, the reference's once


CARD_SUITE = """\
name: cards
defaults: {{model: {card}, batch_size: 1, seq_len: 32, rounds: 1, attention: eager, measure: [memory]}}
scenarios:
  - name: every-k
    activation: {{strategy: every_k, k: 1}}
"""


def test_a_suite_run_reads_each_model_card_once(monkeypatch, tmp_path) -> None:
    """The preflight at load, the run's resource check and the trainer's build (the scenario's and its
    reference's) all take the card from the run's shelf: its file is read and validated once."""
    from pytest_flashckpt.config import model_card
    from pytest_flashckpt.config.run_options import Options
    from pytest_flashckpt.runner.preflight import check_run
    from pytest_flashckpt.runner.cards import CardShelf
    from pytest_flashckpt.runner.suite import SuiteRun, load_checked_suite

    card = tmp_path / "micro.yaml"
    card.write_text(MICRO_CARD, encoding="utf-8")
    (tmp_path / "cards.yaml").write_text(CARD_SUITE.format(card=card), encoding="utf-8")
    reads: list[str] = []
    load_yaml = model_card.load_yaml

    def counted(path, *args, **kwargs):
        reads.append(str(path))
        return load_yaml(path, *args, **kwargs)

    monkeypatch.setattr(model_card, "load_yaml", counted)
    shelf = CardShelf()
    suite = load_checked_suite(str(tmp_path / "cards.yaml"), shelf)
    run = SuiteRun(suite, Options(suite="cards.yaml", device="cpu", report="out", no_compare=True), tmp_path, cards=shelf)
    check_run(run)
    outcome = run.step(suite.scenarios[0])
    assert outcome.result.status == "measured", outcome.result.reason
    assert "memory_saving" in outcome.result.metrics  # the reference was built too
    assert reads.count(str(card)) == 1, reads
    # control: without the shared shelf the preflight and the run read it again
    reads.clear()
    load_checked_suite(str(tmp_path / "cards.yaml"))
    SuiteRun(suite, Options(suite="cards.yaml", device="cpu", report="out", no_compare=True), tmp_path).step(suite.scenarios[0])
    assert reads.count(str(card)) == 2, reads


def test_a_workloads_reference_is_measured_once_whatever_its_steps(monkeypatch, tmp_path) -> None:
    """A reference scenario's own memory pass and FLOP count are its workload's reference's, also for a scenario
    timed at other steps per round (the article's rows at 1, the activation suite's at 2): one each per workload."""
    import dataclasses

    from pytest_flashckpt.activation import flops
    from pytest_flashckpt.runner import run

    counts = {"peak": 0, "flops": 0}
    peak_pass, enter = run.peak_pass, flops.StepCount.__enter__

    def counted_peak(*args, **kwargs):
        counts["peak"] += 1
        return peak_pass(*args, **kwargs)

    def counted_flops(self):  # every FLOP count, in a warm-up step or a count_step of its own
        counts["flops"] += 1
        return enter(self)

    monkeypatch.setattr(run, "peak_pass", counted_peak)
    monkeypatch.setattr(flops.StepCount, "__enter__", counted_flops)
    (tmp_path / "micro.yaml").write_text(MICRO_CARD, encoding="utf-8")
    plain = Scenario("none", model=str(tmp_path / "micro.yaml"), batch_size=1, seq_len=32, rounds=1, attention="eager",
                     activation=ActivationConfig("none", k=2), measure=("memory", "flops"))
    every_k = dataclasses.replace(plain, name="every-k", steps=2, activation=ActivationConfig("every_k", k=1))
    ctx = RunContext(torch.device("cpu"), "cpu")
    first, second = run_scenario(plain, ctx), run_scenario(every_k, ctx)
    assert first.status == second.status == "measured", (first.reason, second.reason)
    assert second.metrics["reference_peak_bytes"] == first.metrics["peak_bytes"]
    assert second.metrics["reference_step_flops"] == first.metrics["step_flops"]
    assert counts == {"peak": 2, "flops": 2}  # none's (= the reference's) and every_k's; the reference not again


def test_a_suite_run_reads_its_baseline_and_words_each_verdict_and_the_comparison_once(monkeypatch, tmp_path) -> None:
    """Over a checked run with a stored baseline (check_run, every step, finish, the end summary, failed()): the
    baseline file is read once, each scenario's verdict word computed once, the run's comparison built once."""
    from fake_runner import FakeRunner

    from pytest_flashckpt.baselines import gate as gate_module
    from pytest_flashckpt.baselines.store import Baseline
    from pytest_flashckpt.config.run_options import Options
    from pytest_flashckpt.runner import suite as suite_module
    from pytest_flashckpt.runner.preflight import check_run
    from pytest_flashckpt.runner.summary import end_summary

    (tmp_path / "once.yaml").write_text(
        "name: once\ndefaults: {model: tiny, batch_size: 1, seq_len: 32, rounds: 2, attention: eager}\n"
        "scenarios:\n  - name: reference\n  - name: every-k\n    activation: {strategy: every_k, k: 1}\n", encoding="utf-8")
    options = Options(suite="once.yaml", device="cpu", report="out")
    first = suite_module.SuiteRun(suite_module.load_checked_suite(str(tmp_path / "once.yaml")),
                                  Options(suite="once.yaml", device="cpu", report="out", save_baseline=True), tmp_path,
                                  runner=FakeRunner())
    first.run_all()  # stores the baseline the counted run is judged against
    counts = {"read": 0, "verdict": 0, "comparison": 0}
    read, verdict, comparison = Baseline.read, suite_module.scenario_verdict, gate_module.Gate.comparison

    def counting(name, function):
        def counted(*args, **kwargs):
            counts[name] += 1
            return function(*args, **kwargs)
        return counted

    monkeypatch.setattr(Baseline, "read", staticmethod(counting("read", read)))
    monkeypatch.setattr(suite_module, "scenario_verdict", counting("verdict", verdict))
    monkeypatch.setattr(gate_module.Gate, "comparison", counting("comparison", comparison))
    run = suite_module.SuiteRun(suite_module.load_checked_suite(str(tmp_path / "once.yaml")), options, tmp_path,
                                runner=FakeRunner())
    check_run(run)
    outputs = run.run_all()
    end_summary(run, outputs)
    assert not run.failed() and run.gate().status == "compared"
    assert [run.verdict(r) for r in run.results] == [run.verdicts[r.id] for r in run.results]
    assert counts == {"read": 1, "verdict": 2, "comparison": 1}


SAVE_SUITE = """\
name: saves
defaults: {{model: {card}, batch_size: 1, seq_len: 32, rounds: 1, attention: eager, measure: [checkpoint],
           checkpoint: {{strategy: sync, saves: 1, time_lost_rounds: 0}}}}
scenarios:
  - name: save-sync
  - name: save-selective
    checkpoint: {{strategy: selective}}
"""


def test_the_machines_save_limits_are_measured_once_per_run(monkeypatch, tmp_path) -> None:
    """The disk's raw write and the memory copy bandwidth (info metrics every save row reads against) are measured
    once per run, not by each checkpoint pass (the scenario's and its reference's); every row records the same
    reading. Control: ``run_checkpoint_pass`` without the run's limits measures them itself."""
    from pytest_flashckpt.checkpoint import bandwidth, measure
    from pytest_flashckpt.config.suites import load_suite

    calls = {"write": 0}
    real = bandwidth.write_bandwidth_MBps

    def counted(folder, *args, **kwargs):
        calls["write"] += 1
        return real(folder, megabytes=8)

    monkeypatch.setattr(measure, "write_bandwidth_MBps", counted)
    card = tmp_path / "micro.yaml"
    card.write_text(MICRO_CARD, encoding="utf-8")
    suite_file = tmp_path / "saves.yaml"
    suite_file.write_text(SAVE_SUITE.format(card=card), encoding="utf-8")
    (tmp_path / "work").mkdir()
    ctx = RunContext(torch.device("cpu"), "cpu", workdir=tmp_path / "work")
    results = [run_scenario(s, ctx) for s in load_suite(str(suite_file)).scenarios]
    assert [r.status for r in results] == ["measured", "measured"], [r.reason for r in results]
    assert calls["write"] == 1  # two scenarios, a reference save: three passes, one reading
    assert len({r.metrics["raw_write_MBps"] for r in results}) == 1

    from pytest_flashckpt.checkpoint import run_checkpoint_pass
    from pytest_flashckpt.config.scenario import SaveConfig
    from pytest_flashckpt.models.cards import build_model
    from pytest_flashckpt.training import Trainer

    trainer = Trainer.create(build_model(ctx.cards.card(str(card), 0.0), "eager", torch.device("cpu"), torch.float32),
                             1, 32)
    run_checkpoint_pass(trainer, SaveConfig(strategy="sync", saves=1, time_lost_rounds=0), tmp_path / "alone", "")
    assert calls["write"] == 2  # the control: a pass given no limits measures them


def _micro(tmp_path) -> str:
    path = tmp_path / "micro.yaml"
    path.write_text(MICRO_CARD, encoding="utf-8")
    return str(path)


def _counted_builds(monkeypatch) -> list[str]:
    from pytest_flashckpt.runner import run as run_module

    built: list[str] = []
    build = run_module._build_trainer

    def counted(scenario, ctx, backend):
        built.append(scenario.name)
        return build(scenario, ctx, backend)

    monkeypatch.setattr(run_module, "_build_trainer", counted)
    return built


def _save_context(tmp_path, **kwargs) -> RunContext:
    """A run context whose machine limits (the disk's raw write, the copy bandwidth: info metrics) are given, so a
    test's checkpoint passes do not write 64 MB to measure them."""
    ctx = RunContext(torch.device("cpu"), "cpu", workdir=tmp_path, **kwargs)
    ctx.cache["machine limits cpu"] = (1000.0, 10.0)
    return ctx


def _save_scenario(card: str, name: str, strategy: str) -> Scenario:
    from pytest_flashckpt.config.scenario import SaveConfig

    return Scenario(name, model=card, batch_size=1, seq_len=32, rounds=1, attention="eager", measure=("checkpoint",),
                    save=SaveConfig(strategy=strategy, saves=2, max_keep=2, time_lost_rounds=0))


def test_scenarios_that_train_the_reference_step_share_its_trainer_and_its_sync_save(monkeypatch, tmp_path) -> None:
    """A scenario with no activation strategy trains its reference's step: it trains the run's one reference
    trainer, and a plain sync save is measured once for the scenario and as the others' reference save."""
    from pytest_flashckpt import checkpoint
    from pytest_flashckpt.runner import run as run_module

    built = _counted_builds(monkeypatch)
    passes: list[str] = []
    real_pass = checkpoint.run_checkpoint_pass

    def counted_pass(trainer, config, workdir, *args, **kwargs):
        passes.append(config.strategy)
        return real_pass(trainer, config, workdir, *args, **kwargs)

    monkeypatch.setattr("pytest_flashckpt.checkpoint.run_checkpoint_pass", counted_pass)  # what run.py imports
    card = _micro(tmp_path)
    ctx = _save_context(tmp_path)
    memory = Scenario("memory", model=card, batch_size=1, seq_len=32, rounds=1, attention="eager", measure=("memory",))
    sync, dcp = _save_scenario(card, "save-sync", "sync"), _save_scenario(card, "save-dcp", "dcp")
    results = [run_scenario(s, ctx) for s in (memory, sync, dcp)]
    assert [r.status for r in results] == ["measured"] * 3, [r.reason for r in results]
    assert len(built) == 1, built  # one trainer for the three
    assert passes == ["sync", "dcp"]  # save-dcp's reference save is save-sync's pass
    assert results[2].metrics["reference_save_total_s"] == results[1].metrics["save_total_s"]
    assert results[2].metrics["reference_bytes_written"] == results[1].metrics["bytes_written"]
    assert all(r.kernel == results[0].kernel for r in results)
    # the other order: the reference pass measured first serves save-sync, which says so
    passes.clear()
    ctx = _save_context(tmp_path)
    later = [run_scenario(s, ctx) for s in (dcp, sync)]
    assert passes == ["dcp", "sync"]
    assert any("measured once in this run for" in note for note in later[1].notes), later[1].notes
    assert run_module._steps_as_reference(sync, ctx) and not run_module._steps_as_reference(
        Scenario("k", model=card, batch_size=1, seq_len=32, activation=ActivationConfig("every_k", k=1)), ctx)


def test_scenarios_that_train_one_strategys_step_share_its_trainer_and_its_notes(monkeypatch, tmp_path) -> None:
    """The article's rows train their activation-suite twin's step and differ in their save: one trainer is built
    and warmed up for all of them, each result still carries the strategy's note; another strategy builds its own,
    and an injected slowdown always gets a trainer of its own (never a shared one), with the strategy's note too."""
    from pytest_flashckpt.config.injection import Injection
    from pytest_flashckpt.config.scenario import SaveConfig

    built = _counted_builds(monkeypatch)
    card = _micro(tmp_path)
    full = ActivationConfig("full")

    def scenario(name, measure, save=SaveConfig(), activation=full):
        return Scenario(name, model=card, batch_size=1, seq_len=32, rounds=1, attention="eager", measure=measure,
                        activation=activation, save=save)

    twin = scenario("full", ("memory",))
    row = scenario("row", ("memory", "checkpoint"), SaveConfig(strategy="async", saves=2, max_keep=2, time_lost_rounds=0))
    other = scenario("every_k", ("memory",), activation=ActivationConfig("every_k", k=1))
    ctx = _save_context(tmp_path)
    results = [run_scenario(s, ctx) for s in (twin, row, other)]
    assert [r.status for r in results] == ["measured"] * 3, [r.reason for r in results]
    assert built == ["full", "full.reference", "every_k"], built  # the row trained the twin's trainer (and reference)
    for result in results[:2]:
        assert [n for n in result.notes if n.startswith("activation: ")] == [
            n for n in results[0].notes if n.startswith("activation: ")] != []
    built.clear()
    (tmp_path / "inject").mkdir()
    injected = run_scenario(row, _save_context(tmp_path / "inject", inject=Injection.parse("step=0.1")))
    assert injected.status == "measured", injected.reason
    assert built.count("row") == 1  # the control: with an injection the row builds its own
    assert any(n.startswith("activation: ") for n in injected.notes) and "injected" in " ".join(injected.notes).lower()


def test_an_injected_slowdown_never_reaches_the_shared_reference(monkeypatch, tmp_path) -> None:
    """With ``--flashckpt-inject`` the scenario's own step is wrapped: it gets a trainer of its own, and its save
    pass is its own (the injected stall must not become the reference's)."""
    from pytest_flashckpt.config.injection import Injection
    from pytest_flashckpt.runner import run as run_module

    built = _counted_builds(monkeypatch)
    card = _micro(tmp_path)
    ctx = _save_context(tmp_path, inject=Injection.parse("stall=0.5"))
    sync = _save_scenario(card, "save-sync", "sync")
    assert not run_module._steps_as_reference(sync, ctx) and not run_module._saves_as_reference(sync, sync.reference(), ctx)
    result = run_scenario(_save_scenario(card, "save-dcp", "dcp"), ctx)
    assert result.status == "measured", result.reason
    assert built == ["save-dcp", "save-dcp.reference"]  # its own trainer, and the reference's


def test_an_auto_kernel_shares_the_entries_of_the_kernel_it_resolves_to(monkeypatch, tmp_path) -> None:
    """``attention: auto`` trains the step of the kernel it resolves to (sdpa on a CPU): its trainer and memory
    pass are that kernel's, measured once."""
    built = _counted_builds(monkeypatch)
    card = _micro(tmp_path)
    ctx = RunContext(torch.device("cpu"), "cpu")
    auto, sdpa = (Scenario(name, model=card, batch_size=1, seq_len=32, rounds=1, attention=kernel, measure=("memory",))
                  for name, kernel in (("auto", "auto"), ("sdpa", "sdpa")))
    first, second = run_scenario(auto, ctx), run_scenario(sdpa, ctx)
    assert first.status == second.status == "measured"
    assert first.backend == "sdpa" and first.config.attention == "auto"  # the record keeps what the suite asked
    assert len(built) == 1, built
    assert first.metrics["peak_bytes"] == second.metrics["peak_bytes"]
    assert any("measured once in this run for" in note for note in second.notes), second.notes


def test_a_scenario_that_trains_the_reference_step_computes_its_reference_once(monkeypatch, tmp_path) -> None:
    """Its trainer, its save pass and the other scenarios' reference save all read the one ``reference()``."""
    calls = []
    reference = Scenario.reference
    monkeypatch.setattr(Scenario, "reference", lambda self: calls.append(self.name) or reference(self))
    ctx = _save_context(tmp_path)
    result = run_scenario(_save_scenario(_micro(tmp_path), "save-sync", "sync"), ctx)
    assert result.status == "measured", result.reason
    assert calls == ["save-sync"]
