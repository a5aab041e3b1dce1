"""Measuring a ``torch.compile``'d step: the allocator's view, with proof that the step ran compiled.

The exact ``cpu`` probe cannot measure a compiled step. It is a ``TorchDispatchMode``, and Dynamo does not compile
a frame while one is active: it runs the frame eager and marks its code to be skipped from then on, so one step
under the probe leaves the model running eager for the rest of the process, timing passes included
(``reports/spike-compile-measure.md``). Inductor's generated code also allocates its buffers outside Python
dispatch, where no dispatch mode sees them. What sees them is the CPU allocator's events (``torch.profiler`` with
``profile_memory``, as ``probes.allocator``); the same profile shows whether compiled code ran ("Torch-Compiled
Region" events), and Dynamo's counters show whether the step compiled anything new (a recompile after warm-up).

``measure_compiled_step`` returns all three from one profiled step and refuses what would read as a compiled
number but is not one: a step under a dispatch mode, a step that ran fewer compiled regions than expected, a
step that recompiled. ``missing_compiler`` is the cheap check that lets a compiled scenario skip with a reason.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch._C._profiler import _EventType
from torch.utils._python_dispatch import _get_current_dispatch_mode

from pytest_flashckpt.probes.allocator import _walk

# torch._inductor and torch._dynamo are imported inside the functions that use them: importing them takes seconds
# and only a compiled step needs them (import_inductor imports Inductor on purpose, under its one warning filter).

COMPILED_REGION = "Torch-Compiled Region"  # the profiler event around every call of Dynamo-compiled code


class NotCompiled(RuntimeError):
    """A step meant to be measured compiled ran (partly) eager, or compiled again after its warm-up."""


@dataclass(frozen=True)
class CompiledStepReading:
    added_peak_bytes: int  # most bytes the CPU allocator had handed out at once, over what it had at the start
    compiled_regions: int  # calls of compiled code during the step (per compiled frame, recomputation included)
    new_graphs: int  # graphs Dynamo compiled during the step (0 after a proper warm-up)


def import_inductor() -> None:
    """Import Inductor's compiler entry point now, so the first ``torch.compile`` call does not. On torch 2.13 that
    import defines ``torch.utils.mkldnn``'s ``torch.jit.ScriptModule`` classes, which warn that
    ``torch.jit.script_method`` is deprecated: torch's own code, not the caller's, yet under pytest's
    ``filterwarnings = error`` it fails the first compiled step. Only that one warning, only during this import,
    is ignored; any other warning still reaches the caller."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script_method` is deprecated", category=DeprecationWarning)
        import torch._inductor.compile_fx  # noqa: F401


def missing_compiler() -> str | None:
    """Why Inductor cannot compile on this CPU (no working C++ compiler), or None. Cheap: Inductor's own search
    (``torch._inductor.config.cpp.cxx``: ``$CXX`` read at import, else ``g++``; it runs ``<cxx> --version``),
    whose answer Inductor caches for the process."""
    from torch._inductor import cpp_builder, exc

    try:
        cpp_builder.get_cpp_compiler()
    except exc.InvalidCxxCompiler:
        searched = [c for c in torch._inductor.config.cpp.cxx if c is not None]
        return (f"torch.compile (Inductor) needs a C++ compiler and found none (searched {', '.join(searched)} on PATH); "
                "install g++ or set CXX to a compiler before starting Python")
    return None


def _unique_graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def allocator_step(step: Callable[[], object]) -> tuple[int, int]:
    """One call of ``step`` under ``torch.profiler``'s memory events: (the CPU allocator's most bytes at once over
    what it held at the start, the compiled regions that ran: "Torch-Compiled Region" events). No check: callers
    decide what a reading must show (``measure_compiled_step``, ``runner.compiled``)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = list(_walk(prof.profiler.kineto_results.experimental_event_tree()))
    allocations = sorted((e for e in events if e.tag == _EventType.Allocation and str(e.extra_fields.device) == "cpu"),
                         key=lambda e: e.start_time_ns)
    peak = 0
    if allocations:
        first = allocations[0].extra_fields
        peak = max(e.extra_fields.total_allocated for e in allocations) - (first.total_allocated - first.alloc_size)
    return peak, sum(e.name.startswith(COMPILED_REGION) for e in events)


def measure_compiled_step(step: Callable[[], object], expected_regions: int = 1) -> CompiledStepReading:
    """Run ``step`` (already warmed up: compiled, optimizer state made) once under the profiler's memory events.

    Raises ``NotCompiled`` before running it under a ``TorchDispatchMode`` (Dynamo would run it eager and keep
    it eager afterwards), and after it if it compiled a new graph (a recompile after warm-up) or ran other than
    ``expected_regions`` compiled regions: fewer, a compiled frame ran eager (skipped); more, a graph break split
    a frame into pieces (each runs as its own region). A checkpoint outside a compiled block runs the block's
    region again when it recomputes, so count those twice."""
    mode = _get_current_dispatch_mode()
    if mode is not None:
        raise NotCompiled(
            f"a compiled step cannot be measured under the dispatch mode {type(mode).__name__} (the cpu probe is one): "
            "Dynamo runs the step eager and skips its frames from then on; measure it with measure_compiled_step alone"
        )
    graphs = _unique_graphs()
    peak, regions = allocator_step(step)
    reading = CompiledStepReading(peak, regions, _unique_graphs() - graphs)
    if reading.new_graphs:
        raise NotCompiled(f"the step compiled {reading.new_graphs} new graph(s) after its warm-up (a recompile); "
                          "its peak and time include compiling: find the changing guard with TORCH_LOGS=recompiles")
    if reading.compiled_regions != expected_regions:
        why = "a compiled frame ran eager" if reading.compiled_regions < expected_regions else "a graph break split a frame"
        raise NotCompiled(f"the step ran {reading.compiled_regions} compiled region(s), expected {expected_regions}: "
                          f"{why} (TORCH_LOGS=graph_breaks,recompiles says where)")
    return reading


NON_LEAF_GRAD = r"The \.grad attribute of a Tensor that is not a leaf Tensor is being accessed"
# Dynamo makes the context of every autograd.Function it traces from a bare torch.autograd.Function() (torch 2.13,
# torch._dynamo.side_effects.track_object_new), which warns that Functions should not be instantiated
DYNAMO_FUNCTION_CONTEXT = r"<class 'torch\.autograd\.function\.Function'> should not be instantiated"


@contextlib.contextmanager
def dynamos_hidden_warnings() -> Iterator[None]:
    """Keep hidden, under warnings-as-errors, the warnings torch's own tracing gives while Dynamo traces a block.
    Dynamo reads ``.grad`` of every tensor it wraps (``torch._dynamo.variables.builder.safe_has_grad``), which warns
    for a non-leaf (a block's hidden states, a checkpoint's inputs), and hides that warning by swapping
    ``warnings.showwarning``; an ``error`` filter (pytest's ``filterwarnings = error``, ``python -W error``) raises it
    before that hook is reached, so every per-block compile would fail at its first trace. And Dynamo makes the
    context of a traced ``autograd.Function`` (the ring attention of a compiled context-parallel block,
    ``distributed.context_parallel``) from a bare ``torch.autograd.Function()``, which torch warns against
    (``DYNAMO_FUNCTION_CONTEXT``). Exactly those messages are ignored, only inside the block; any other warning still
    reaches the caller. Used by the compiled runner (``runner.compiled``), compiled ranks (``compile_step``) and the
    compiled simulator (``simulate.compiled``)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=NON_LEAF_GRAD, category=UserWarning)
        warnings.filterwarnings("ignore", message=DYNAMO_FUNCTION_CONTEXT, category=DeprecationWarning)
        yield


@contextlib.contextmanager
def inductor_buffers_dispatched() -> Iterator[None]:
    """While active, Inductor's CPU buffers of code compiled meanwhile are allocated where a dispatch mode sees them.

    The Python wrapper Inductor generates binds ``empty_strided_cpu`` to ``torch._C._dynamo.guards._empty_strided_cpu``
    when its module loads: a fast path to the allocator that skips the dispatcher. So a rank probe run under compiled
    code (``distributed.memory.CompiledShardedProbe``) never sees a buffer that only generated C++ kernels touch
    before it is freed, and read up to 4.5% under the simulated rank, which allocates them through the dispatcher
    (reports/spike-compiled-fake-ranks.md measures the probe both ways). The simulator swaps that helper for
    ``torch.empty_strided`` in the modules it loads (``simulate.compiled``). Here every module loaded while this is
    active gets a helper that allocates through ``torch.empty_strided`` when a dispatch mode is on the stack (the
    same bytes from the same allocator, now seen), and through the fast path when none is (timed steps keep
    Inductor's path, plus one Python call per buffer)."""
    guards = torch._C._dynamo.guards
    fast = guards._empty_strided_cpu

    def empty_strided_cpu(size, stride, dtype):
        if torch._C._len_torch_dispatch_stack():
            return torch.empty_strided(size, stride, dtype=dtype, device="cpu")
        return fast(size, stride, dtype)

    guards._empty_strided_cpu = empty_strided_cpu
    try:
        yield
    finally:
        guards._empty_strided_cpu = fast
