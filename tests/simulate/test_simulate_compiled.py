"""``simulate.compiled``: a compiled step's peak from Inductor's own plan on fake tensors, no kernel run.

The fast tests pin the pieces that make it work without compiling anything (the probe Dynamo does not skip under,
the wrapper helpers' fake stand-ins, the refusals). The compile-driven ones are ``slow`` and skip without a C++
compiler: a fused kernel's intermediates never exist in the plan (the control: eager on the same fake tensors
makes them), and the tiny card's simulated step equals the CPU allocator's measured one within the 5% bound.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import any_torch_dispatch_mode_on_stack

from pytest_flashckpt.probes.compiled import import_inductor, missing_compiler
from pytest_flashckpt.simulate.compiled import (
    CompiledStepProbe,
    _fake_reinterpret,
    _kernel_names,
    inductor_plans,
    simulate_compiled_step,
)
from pytest_flashckpt.simulate.probe import AttributedStorages

MISSING = missing_compiler()
BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "compiled_sim_vs_measured.py"
needs_compiler = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


def test_dynamo_compiles_under_the_compiled_step_probe_and_not_under_the_plain_one():
    with CompiledStepProbe("cpu"):
        assert not any_torch_dispatch_mode_on_stack()
    with AttributedStorages("cpu"):  # control: the simulator's eager probe makes Dynamo skip every frame
        assert any_torch_dispatch_mode_on_stack()


def test_fake_reinterpret_is_inductors_reinterpret_tensor():
    base = torch.arange(24.0)[2:]
    ours = _fake_reinterpret(base, (3, 4), (1, 3), 5)
    theirs = torch._C._dynamo.guards._reinterpret_tensor(base, (3, 4), (1, 3), 5)
    assert torch.equal(ours, theirs) and ours.storage_offset() == theirs.storage_offset() == 7
    assert not torch.equal(ours, _fake_reinterpret(base, (3, 4), (1, 3), 0))  # control: the offset counts


def test_kernel_names_are_the_async_compiled_ones():
    source = ("import torch\nasync_compile = AsyncCompile()\ncpp_fused_add_0 = async_compile.cpp_pybinding(['float*'], r'''x''')\n"
              "other = torch.ops.aten\nk1 = async_compile.cpp('y')\n")
    assert _kernel_names(source) == ["cpp_fused_add_0", "k1"]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"scope": "layer"}, "unknown compile scope 'layer'; valid: block, model"),
    ({"strategy": "offload"}, "activation strategy 'offload' is not simulated compiled; valid: none, full, every_k, selective_op, compile_budget, budget"),
    ({"strategy": "budget"}, "policies .* required by it; got strategy 'budget' with no policies"),
    ({"strategy": "compile_budget"}, "budget .* required by it; got strategy 'compile_budget' with budget None"),
    ({"strategy": "full", "budget": 0.5}, "got strategy 'full' with budget 0.5"),
    ({"seq": 10**6}, "sequence"),
    ({"plan": "liveness"}, "unknown region plan 'liveness'; valid: inductor, fx"),
])
def test_refusals_name_the_value_before_compiling(kwargs, message):
    args = {"card": "tiny", "batch": 1, "seq": 32, **kwargs}
    with pytest.raises(ValueError, match=message):
        simulate_compiled_step(**args)


@pytest.mark.slow
def test_no_cpp_compiler_is_refused_with_inductors_reason_before_compiling(monkeypatch):
    from pytest_flashckpt.simulate import compiled

    monkeypatch.setattr(compiled, "missing_compiler", lambda: "torch.compile (Inductor) needs a C++ compiler")
    monkeypatch.setattr(compiled, "_fake_model", lambda *_: pytest.fail("built a model without a compiler"))
    with pytest.raises(RuntimeError, match="needs a C"):
        simulate_compiled_step("tiny", 1, 32)


@needs_compiler
@pytest.mark.slow  # Inductor lowers and plans (no C++ compiled): seconds on 2 shared cores
def test_a_fused_kernels_intermediate_never_exists_in_the_plan():
    import_inductor()
    torch._dynamo.reset()

    def f(x):
        return (x.sin() + 1).cos()

    try:
        with FakeTensorMode(), inductor_plans() as plans:
            x = torch.empty(256, 256)
            compiled = torch.compile(f)
            compiled(x)  # compiles
            plans.regions[0].calls = 0
            compiled_probe, eager_probe = CompiledStepProbe("cpu"), CompiledStepProbe("cpu")
            compiled_probe.add(x)
            with compiled_probe:
                out = compiled(x)
            del out
            eager_probe.add(x)
            with eager_probe:  # control: eager makes sin's and the add's outputs too
                out = f(x)
    finally:
        torch._dynamo.reset()
    one = 256 * 256 * 4
    assert [r.calls for r in plans.regions] == [1]
    assert compiled_probe.peak_bytes == 2 * one  # x and the one fused kernel's output
    assert eager_probe.peak_bytes == 3 * one  # x, an intermediate and the output alive at once


@needs_compiler
@pytest.mark.slow  # one real Inductor compile (g++) and one simulated: 1-4 min on 2 shared cores
@pytest.mark.parametrize("scope", ["block", "model"])
def test_simulated_equals_the_allocators_measured_step_within_the_bound(scope):
    spec = importlib.util.spec_from_file_location("compiled_sim_vs_measured", BENCHMARK)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)  # the benchmark's own measurement: the allocator's events
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the benchmark measures (CPU flash attention's scratch depends on it)
    torch._dynamo.reset()
    try:
        measured = benchmark.measure("tiny", 2, 128, "full", scope)
        torch._dynamo.reset()
        simulated = simulate_compiled_step("tiny", 2, 128, "full", scope)
    finally:
        torch.set_num_threads(threads)
        torch._dynamo.reset()
    for metric in benchmark.METRICS:
        assert simulated[metric] == pytest.approx(measured[metric], rel=0.05), metric
    assert measured["new_graphs_after_warmup"] == 0 and measured["graph_breaks"] == 0
