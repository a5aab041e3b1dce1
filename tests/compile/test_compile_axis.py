"""The compile axis (config.axes.CompileConfig, docs/compile.md) without compiling anything: what a suite may write,
what is refused before anything runs (naming the key and the fix), the fingerprint, the compile_budget strategy's
registry row, the skip without a C++ compiler, and the report's section. Compiling is in test_compiled_step.py."""

from __future__ import annotations

import argparse
import functools

import pytest
import torch

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.activation.wrapper import BlockForward
from pytest_flashckpt.config.errors import ConfigError, InputError
from pytest_flashckpt.config.fingerprint import changed_keys, fingerprint, fingerprinted
from pytest_flashckpt.config.scenario import ActivationConfig, Scenario
from pytest_flashckpt.config.typed import build
from pytest_flashckpt.core.registry import simulated_strategies
from pytest_flashckpt.core.result import Result
from pytest_flashckpt.models.anatomy import get_anatomy, get_blocks
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.report.compiled import compiled_section
from pytest_flashckpt.report.select import describe_activation
from pytest_flashckpt.runner import compiled
from pytest_flashckpt.runner.context import RunContext
from pytest_flashckpt.runner.run import run_scenario
from pytest_flashckpt.simulate.cli import chosen_strategy


def scenario(**raw) -> Scenario:
    return build(Scenario, {"name": "s", **raw}, "suite.yaml")


@pytest.mark.parametrize("axis", [{"scope": "block"}, {"scope": "model"}, {"scope": "block", "fullgraph": True},
                                  {"scope": "model", "dynamic": False}])
def test_built_values_are_accepted_and_enter_the_fingerprint(axis):
    eager, compiled_ = scenario(), scenario(compile=axis)
    assert compiled_.compile.enabled and not eager.compile.enabled
    assert fingerprint(compiled_) != fingerprint(eager)  # an old (eager) baseline reads "not comparable"
    assert "compile.scope: \"(absent)\" -> \"%s\"" % axis["scope"] in changed_keys(fingerprinted(eager), fingerprinted(compiled_))
    assert not any(k.startswith("compile.") for k in fingerprinted(eager))  # control: eager fingerprints as before
    assert compiled_.reference().compile == compiled_.compile  # the reference is compiled the same way


def test_budget_on_compiled_blocks_is_the_compiled_plan_and_accepted():
    compiled_ = scenario(compile={"scope": "block"}, activation={"strategy": "budget", "budget": "min + 50%"})
    assert compiled_.compile.enabled and compiled_.activation.strategy == "budget"
    with pytest.raises(ConfigError, match="not built yet"):  # control: per model it is refused
        scenario(compile={"scope": "model"}, activation={"strategy": "budget", "budget": "min + 50%"})


@pytest.mark.parametrize("raw, words", [
    ({"compile": {"scope": "block", "mode": "max-autotune"}}, ["compile.mode", "not built yet", "'default'"]),
    ({"compile": {"fullgraph": True}}, ["compile.fullgraph", "compile.scope is 'none'"]),
    ({"compile": {"scope": "threads"}}, ["compile.scope", "block"]),
    ({"compile": {"scope": "model"}, "world_size": 2}, ["'model'", "world_size 2", "not built"]),  # ranks compile blocks
    ({"compile": {"scope": "block"}, "checkpoint": {"strategy": "sync"}}, ["checkpoint pass", "not built yet"]),
    ({"compile": {"scope": "block"}, "activation": {"strategy": "offload"}}, ["offload", "break Dynamo's graph", "compile.ac_wrapper: outside"]),
    ({"compile": {"scope": "model"}, "activation": {"strategy": "offload"}}, ["compile.scope: model", "offload", "spike-compiled-offload.md", "compile.scope: block"]),
    ({"compile": {"scope": "block", "ac_wrapper": "outside"}, "activation": {"strategy": "offload"}, "world_size": 2}, ["offload", "world_size 2", "not", "built"]),
    ({"compile": {"scope": "block", "ac_wrapper": "outside"}, "activation": {"strategy": "selective_op"}}, ["outside", "selective_op", "full, every_k, offload"]),
    ({"compile": {"scope": "model"}, "activation": {"strategy": "budget", "budget": 0.6}}, ["'model' with activation.strategy budget", "not built yet", "compile.scope to block"]),
    ({"activation": {"strategy": "compile_budget", "budget": 0.5}}, ["compile_budget", "set compile.scope"]),
    ({"compile": {"scope": "model"}, "activation": {"strategy": "compile_budget"}}, ["activation.budget", "[0, 1]"]),
    ({"compile": {"scope": "model"}, "activation": {"strategy": "compile_budget", "budget": "min"}}, ["activation.budget", "[0, 1]"]),
    ({"compile": {"scope": "model"}, "activation": {"strategy": "compile_budget", "budget": 1.5}}, ["activation.budget", "1.5"]),
])
def test_what_a_compiled_scenario_cannot_be_is_refused_before_anything_runs(raw, words):
    with pytest.raises(ConfigError) as info:
        scenario(**raw)
    text = str(info.value)
    assert text.startswith("suite.yaml: ") and all(w in text for w in words), text


def test_offload_compiles_with_its_hooks_around_each_compiled_block():
    ok = scenario(compile={"scope": "block", "ac_wrapper": "outside"}, activation={"strategy": "offload"})
    assert ok.activation.strategy == "offload" and ok.compile.ac_wrapper == "outside"
    assert ok.reference().activation.strategy == "none" and ok.reference().compile == ok.compile


def test_compile_budget_is_a_registered_strategy_the_simulator_refuses_with_its_reason():
    ok = scenario(compile={"scope": "block"}, activation={"strategy": "compile_budget", "budget": 0.5})
    assert ok.activation.budget == 0.5 and ok.reference().activation.strategy == "none"
    assert "compile_budget" not in simulated_strategies() and "full" in simulated_strategies()  # control
    with pytest.raises(InputError, match="compile_budget: .*not simulated yet"):
        chosen_strategy(argparse.Namespace(strategy="compile_budget", budget=None))


def test_a_compiled_scenario_skips_with_the_reason_when_no_compiler_is_found(monkeypatch):
    reason = "torch.compile (Inductor) needs a C++ compiler and found none (searched g++ on PATH); install g++"
    monkeypatch.setattr(compiled, "compiler_missing", lambda: reason)
    built = []
    monkeypatch.setattr("pytest_flashckpt.runner.run._build_trainer", lambda *a: built.append(a))
    result = run_scenario(scenario(compile={"scope": "block"}, activation={"strategy": "full"}, seq_len=16),
                          RunContext.resolve("cpu", "auto"))
    assert result.status == "skipped" and result.reason == reason and not built  # nothing built before the skip


@pytest.mark.slow
def test_the_block_wrapper_hands_checkpoint_a_partial_and_keeps_its_role_hooks():
    """Dynamo traces a checkpoint's context_fn only as a plain function or a functools.partial (a lambda is
    refused inside a compiled block); the role hooks' handles are kept so a compiled block can drop them."""
    model = build_model(load_card("tiny"), "sdpa", torch.device("cpu"), torch.float32, seed=0)
    apply_ac(model, ActivationConfig(strategy="selective_op"))
    forward = get_blocks(model, get_anatomy(model))[0].__dict__["forward"]
    assert isinstance(forward, BlockForward) and forward.role_hooks is not None and forward.block is not None
    seen = []
    import pytest_flashckpt.activation.wrapper as wrapper

    original = wrapper.checkpoint
    try:
        wrapper.checkpoint = lambda fn, *a, context_fn=None, **k: seen.append(context_fn) or original(fn, *a, context_fn=context_fn, **k)
        model(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long)).backward()
    finally:
        wrapper.checkpoint = original
    assert seen and all(isinstance(fn, functools.partial) for fn in seen)
    compiled.compile_model(model, scenario(compile={"scope": "block"}).compile)  # compiles lazily: nothing runs
    assert forward.role_hooks is None and not get_blocks(model, get_anatomy(model))[0].attn.c_proj._forward_pre_hooks


def _result(name: str, recompiles: int, **raw) -> Result:
    r = Result("compiled", name, "measured", scenario(**raw))
    for key, value in {"peak_bytes": 2**20, "memory_saving": 0.25, "compile_time_s": 12.0, "recompiles": recompiles,
                       "compiled_regions": 4, "peak_memory_source": compiled.PEAK_SOURCE_CPU}.items():
        r.record(key, value)
    return r


def test_the_report_section_names_the_compile_and_flags_a_recompile():
    clean = _result("clean", 0, compile={"scope": "block"}, activation={"strategy": "full"})
    again = _result("again", 2, compile={"scope": "model"}, activation={"strategy": "compile_budget", "budget": 0.5})
    text = "\n".join(compiled_section([clean, again]))
    assert "full, compiled per block" in text and "compile_budget 0.5, compiled model" in text
    assert "**2 (flagged)**" in text and "| 0 " in text and "allocator events" in text
    assert compiled_section([Result("eager", "e", "measured", scenario(activation={"strategy": "full"}))]) == []  # control
    assert describe_activation(Result("eager", "e", "measured", scenario(activation={"strategy": "full"}))) == "full"
    outside = Result("c", "o", "measured", scenario(compile={"scope": "block", "ac_wrapper": "outside"},
                                                     activation={"strategy": "full"}))
    assert describe_activation(outside) == "full, compiled per block, checkpoint outside"  # apart from the inside row
