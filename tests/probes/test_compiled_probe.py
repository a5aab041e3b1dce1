"""``probes.compiled``: a compiled step measured by the allocator, refused where the number would not be a compiled
one. Each refusal has a control showing what it guards against happens without it: under the ``cpu`` probe's
dispatch mode the compiled function really runs eager (and stays eager), a changed shape really recompiles, and
an empty PATH really leaves Inductor without a compiler."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from torch._inductor import cpp_builder

from pytest_flashckpt.probes.compiled import COMPILED_REGION, NotCompiled, import_inductor, measure_compiled_step, missing_compiler
from pytest_flashckpt.probes.cpu import _LiveStorages

MISSING = missing_compiler()
needs_compiler = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


def _regions(fn) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.name.startswith(COMPILED_REGION) for e in prof.events())


@pytest.fixture
def compiled_step():
    """A small compiled forward + backward, warmed up (compiled) outside any mode; Dynamo reset around it."""
    import_inductor()
    torch._dynamo.reset()
    weight = torch.randn(64, 64, requires_grad=True)

    @torch.compile
    def loss(x):
        return (torch.tanh(x @ weight) * 2).sum()

    def step(rows: int = 32):
        loss(torch.randn(rows, 64)).backward()
        weight.grad = None

    step()
    yield step
    torch._dynamo.reset()


@needs_compiler
@pytest.mark.slow  # compiles with Inductor (g++): 5-30 s cold on 2 shared cores
def test_compiled_step_is_measured_with_its_region(compiled_step):
    reading = measure_compiled_step(compiled_step)
    assert reading.compiled_regions == 1 and reading.new_graphs == 0
    assert reading.added_peak_bytes >= 32 * 64 * 4  # at least the activation Inductor's forward allocates


@needs_compiler
@pytest.mark.slow  # compiles with Inductor (g++): 5-30 s cold on 2 shared cores
def test_refused_under_the_cpu_probes_dispatch_mode(compiled_step):
    with _LiveStorages(), pytest.raises(NotCompiled, match="dispatch mode _LiveStorages"):
        measure_compiled_step(compiled_step)
    assert _regions(compiled_step) == 1  # the refusal ran nothing: the function is still compiled


@needs_compiler
@pytest.mark.slow  # compiles with Inductor (g++): 5-30 s cold on 2 shared cores
def test_control_a_step_under_the_dispatch_mode_runs_eager_and_stays_eager(compiled_step):
    """What the refusal prevents: one step under the mode runs no compiled code, and nor does any step after it,
    which the region count then refuses."""
    assert _regions(compiled_step) == 1
    with _LiveStorages():
        assert _regions(compiled_step) == 0
    assert _regions(compiled_step) == 0
    with pytest.raises(NotCompiled, match="ran 0 compiled region"):
        measure_compiled_step(compiled_step)


@needs_compiler
@pytest.mark.slow  # compiles with Inductor (g++): 5-30 s cold on 2 shared cores
def test_recompile_after_warm_up_is_refused(compiled_step):
    torch._dynamo.config.automatic_dynamic_shapes = False  # every new shape is a new graph (the default may go dynamic)
    try:
        measure_compiled_step(compiled_step)  # control: the warmed-up shape compiles nothing
        with pytest.raises(NotCompiled, match="1 new graph"):
            measure_compiled_step(lambda: compiled_step(rows=48))
    finally:
        torch._dynamo.config.automatic_dynamic_shapes = True


def test_expected_regions_must_match():
    """No compiled code at all (an eager step) is refused; expecting none, it is measured."""
    step = lambda: torch.randn(16, 16).sum()  # noqa: E731
    with pytest.raises(NotCompiled, match="expected 1"):
        measure_compiled_step(step)
    assert measure_compiled_step(step, expected_regions=0).compiled_regions == 0


@pytest.fixture
def fresh_compiler_search():
    """Inductor caches its compiler search for the process; each side of the test searches afresh."""
    cpp_builder.cpp_compiler_search.cache_clear()
    yield
    cpp_builder.cpp_compiler_search.cache_clear()


def test_missing_compiler_names_the_fix(tmp_path, monkeypatch, fresh_compiler_search):
    monkeypatch.delenv("CXX", raising=False)  # torch read $CXX at import; the search runs the names it holds
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no g++
    reason = missing_compiler()
    assert reason is not None and "needs a C++ compiler and found none (searched g++ on PATH)" in reason
    assert "install g++ or set CXX" in reason


@needs_compiler
def test_control_the_same_search_finds_this_machines_compiler(fresh_compiler_search):
    assert missing_compiler() is None


def test_inductor_buffers_are_allocated_where_a_dispatch_mode_sees_them_while_one_is_active():
    """``inductor_buffers_dispatched`` swaps the helper Inductor's wrapper binds at module load
    (``torch._C._dynamo.guards._empty_strided_cpu``): under a dispatch mode it allocates through
    ``torch.empty_strided`` (seen by the mode), with none it takes the fast path; the same tensor either way, and the
    helper restored after. Control: the fast path itself is invisible to the mode."""
    from pytest_flashckpt.probes.compiled import inductor_buffers_dispatched

    guards = torch._C._dynamo.guards
    fast = guards._empty_strided_cpu
    seen = _LiveStorages()
    with seen:
        fast((4, 8), (8, 1), torch.float32)  # control: the fast path skips the dispatcher
    assert seen.peak_bytes == 0
    with inductor_buffers_dispatched():
        helper = guards._empty_strided_cpu  # what a module loaded now binds
        assert helper is not fast
        with seen:
            buffer = helper((4, 8), (8, 1), torch.float32)
            assert seen.live_bytes == 4 * 8 * 4
        plain = helper((4, 8), (8, 1), torch.float32)  # no mode: the fast path
        assert (buffer.shape, buffer.stride(), buffer.dtype) == (plain.shape, plain.stride(), plain.dtype)
    assert guards._empty_strided_cpu is fast
