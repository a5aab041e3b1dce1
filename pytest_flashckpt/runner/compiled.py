"""A compiled scenario (``compile.scope`` block or model) measured in this process: the compiled step and its
compiled reference, side by side (docs/compile.md).

Why not the passes of an eager scenario: the exact ``cpu`` probe is a ``TorchDispatchMode``, and Dynamo runs a
frame eager while one is active and keeps skipping it afterwards (``reports/spike-compile-measure.md``), so one
step under the probe would turn the whole scenario into an eager measurement, silently. Here:

- ``torch._dynamo.reset()`` first: every compiled scenario compiles its own model, so no row reuses or recompiles
  another row's graphs (rows of other sequence lengths included) and no code object nears Dynamo's recompile
  limit (past it Dynamo runs the frame eager);
- the strategy's model and the reference's (no checkpointing, compiled the same way) are compiled and warmed up
  outside any dispatch mode; the first step's wall time is ``compile_time_s``, recorded apart from ``step_time_s``;
- the warm-up must have compiled something, with no graph break (a break runs the code between the pieces eager);
- each side's peak is read from one step under ``torch.profiler``'s memory events (the allocator's view, which
  sees Inductor's buffers), and that step must have run the expected compiled regions (one per block, or one for
  the model): fewer means a frame ran eager, which is an error, never a row;
- the timing pass interleaves the two compiled steps; graphs compiled after the warm-up (memory and timing
  passes) are counted as ``recompiles``, noted and flagged in the report.

``compile_budget`` (torch's ``activation_memory_budget``) compiles the strategy's model with a backend of its own
that runs Inductor under that budget: the budget is no Dynamo guard, so with Inductor itself the reference (same
code, same guards) would reuse the strategy's graphs, or the strategy the reference's.
"""

from __future__ import annotations

from typing import Callable

import torch

from pytest_flashckpt.compile_step import (  # noqa: F401  (re-exported: the compiled scenario's names)
    CompiledSide,
    NotCompiled,
    StepReading,
    budget_backend,
    check_regions,
    compile_model,
    compiled_side,
    compiler_missing,
    dynamo_counts,
    read_step,
    torch_hidden_warning,
)
from pytest_flashckpt.config.scenario import Scenario
from pytest_flashckpt.core.metrics import Measurements
from pytest_flashckpt.core.result import Result
from pytest_flashckpt.runner.confirm import confirmation, note_confirmation
from pytest_flashckpt.runner.context import RunContext, SkipScenario
from pytest_flashckpt.runner.passes import peak_pass, resident_tensors, timing_pass
from pytest_flashckpt.training import Trainer

PEAK_SOURCE_CPU = "allocator events (torch.profiler profile_memory) of one compiled step"


def check_can_compile(ctx: RunContext) -> None:
    """``SkipScenario`` with the reason where a compiled scenario cannot be measured here: no C++ compiler for
    Inductor (README promises only python3 and pip), or on a GPU a probe that is a dispatch mode."""
    reason = compiler_missing()
    if reason is not None:
        raise SkipScenario(reason)
    if ctx.device.type != "cpu" and ctx.probe not in ("cuda", "nvml"):
        raise SkipScenario(f"a compiled step on {ctx.device.type} is measured by the allocator (probe cuda or nvml); "
                           f"the {ctx.probe} probe would run it eager")


def state_bytes(trainer: Trainer) -> int:
    """Bytes of the training state alive between steps (each storage once)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in resident_tensors(trainer.state_tensors())}
    return sum(storages.values())


def peak_of(side: CompiledSide, name: str, ctx: RunContext) -> Measurements:
    """``peak_bytes`` and ``state_bytes`` of one compiled step and the regions it ran (``NotCompiled`` for fewer
    than expected: a frame ran eager; more: a graph broke). On a GPU the run's allocator probe reads the peak (no
    dispatch mode: ``cuda`` or ``nvml``), after the region check on a step of its own."""
    reading = check_regions(side, read_step(side.trainer.train_step), name)
    out = Measurements()
    if ctx.device.type == "cpu":
        start = state_bytes(side.trainer)
        out.record("peak_bytes", start + reading.added_peak_bytes)
        out.record("state_bytes", start)
    else:
        gpu = peak_pass(side.trainer.train_step, side.trainer.state_tensors(), ctx.probe, ctx.device)
        out.record("peak_bytes", gpu.peak_bytes)
        out.record("state_bytes", gpu.start_bytes)
    out.record("compiled_regions", reading.compiled_regions)
    return out


def measure_compiled(scenario: Scenario, ctx: RunContext, result: Result, build: Callable[[Scenario], Trainer]) -> Trainer:
    """The memory and timing passes of a compiled scenario against its compiled reference (module docstring);
    ``build(scenario)`` makes a trainer with the scenario's activation strategy applied, not warmed up. Returns the
    compiled trainer. Skips with the reason where it cannot compile (``check_can_compile``)."""
    check_can_compile(ctx)
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    backend = budget_backend(scenario.activation.budget) if scenario.activation.strategy == "compile_budget" else None  # type: ignore[arg-type]
    ctx.phase("build and compile")
    side = compiled_side(build(scenario), scenario, scenario.warmup, backend, ctx.phase)
    result.record("compile_time_s", side.compile_time_s)
    reference = None
    if not scenario.is_reference:
        ctx.phase("reference: build and compile")
        reference = compiled_side(build(scenario.reference()), scenario.reference(), scenario.warmup,
                                  on_phase=lambda text: ctx.phase(f"reference {text}"), first=False)
        result.record("reference_compile_time_s", reference.compile_time_s)
    graphs_after_warmup = dynamo_counts()[0]
    if ctx.device.type == "cpu":
        result.probe = "allocator"  # not the exact probe: judged with the memory tolerance (core.metrics, "memory")
        result.record("peak_memory_source", PEAK_SOURCE_CPU)
    if "memory" in scenario.measure:
        ctx.phase("memory pass (allocator events)")
        result.absorb(peak_of(side, scenario.name, ctx))
        if reference is not None:
            ref = peak_of(reference, f"{scenario.name}.reference", ctx)
            result.record("reference_peak_bytes", ref["peak_bytes"])
            result.record("memory_saving", 1.0 - result.metrics["peak_bytes"] / ref["peak_bytes"])  # type: ignore[operator]
    if "timing" in scenario.measure:
        timing = timing_pass(side.trainer.train_step, None if reference is None else reference.trainer.train_step,
                             scenario.rounds, scenario.steps, ctx.device,
                             on_round=lambda i, n: ctx.phase(f"timing round {i}/{n}"),
                             more_rounds=confirmation(ctx, result))
        result.absorb(timing.measurements())
        note_confirmation(result, scenario.rounds, timing)
    recompiles = dynamo_counts()[0] - graphs_after_warmup
    result.record("recompiles", recompiles)
    if recompiles:
        result.notes.append(f"compile: {recompiles} graph(s) compiled after the warm-up (recompiles): its peak and "
                            "times include compiling; TORCH_LOGS=recompiles names the changing guard")
    result.notes.append(f"compile: scope {scenario.compile.scope}, {side.regions_per_step} compiled region(s) per step, "
                        f"first step {side.compile_time_s:.1f} s")
    return side.trainer
