"""Compiling a model's blocks (or the whole model) with ``torch.compile`` and checking that a compiled step ran
compiled: the part of a compiled scenario shared by the one-process runner (``runner.compiled``) and a rank of a
distributed scenario (``distributed.rank``). docs/compile.md says how a compiled step is measured and why.
"""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn as nn

from pytest_flashckpt.activation.wrapper import (BlockForward, drop_role_hooks, save_on_host,
                                                save_on_host_keeping_strides)
from pytest_flashckpt.config.axes import CompileConfig
from pytest_flashckpt.config.scenario import Scenario
from pytest_flashckpt.models.anatomy import get_anatomy, get_blocks
from pytest_flashckpt.probes.compiled import allocator_step, dynamos_hidden_warnings, import_inductor, missing_compiler
from pytest_flashckpt.training import Trainer


class NotCompiled(RuntimeError):
    """A scenario meant to run compiled ran (partly) eager: an error, never a row."""


@dataclass(frozen=True)
class CompiledSide:
    """One compiled trainer (the scenario's or its reference's) and what its compile and warm-up showed."""

    trainer: Trainer
    regions_per_step: int  # compiled regions one step must run (blocks, or 1 for the model)
    compile_time_s: float  # wall time of the first step: tracing and compiling forward and backward, plus one step


@dataclass(frozen=True)
class StepReading:
    added_peak_bytes: int
    compiled_regions: int



def compiler_missing() -> str | None:
    """Why Inductor cannot compile here (no C++ compiler), or None."""
    import_inductor()
    return missing_compiler()


def compile_model(model: nn.Module, config: CompileConfig, backend: Callable | None = None) -> int:
    """``model`` compiled in place (``nn.Module.compile``: parameter names stay the model's own) by ``config``:
    each block of its anatomy (the activation strategy's wrapper, installed first, runs inside the compiled block:
    torchtitan's order) or the whole model. With ``ac_wrapper: outside`` a checkpointed block's own forward is
    compiled instead and the strategy's wrapper checkpoints the compiled call in eager (``compile_under_wrapper``).
    Returns the compiled regions one step runs.

    A strategy's role hooks are taken off the compiled blocks: Dynamo cannot trace their ``ContextVar``, and under
    compile the policy reads a matmul's role from the traced node instead (``activation.policy.traced_role``)."""
    import_inductor()  # before torch.compile imports it, under its one warning filter (probes.compiled)
    options = {"fullgraph": config.fullgraph, "dynamic": config.dynamic}
    options.update({"backend": backend} if backend is not None else {"mode": config.mode})
    blocks = get_blocks(model, get_anatomy(model))
    drop_role_hooks(blocks)
    if config.scope == "model":
        model.compile(**options)
        return 1
    if config.ac_wrapper == "outside":
        return sum(compile_under_wrapper(block, options) for block in blocks)
    for block in blocks:
        block.compile(**options)
    return len(blocks)


def compile_under_wrapper(block: nn.Module, options: dict) -> int:
    """A checkpointed block's original forward compiled inside its strategy's wrapper (``BlockForward``, which stays
    eager), so no checkpoint is traced into a compiled graph: under tensor parallel on torch 2.13 a traced
    checkpoint saves a ``DeviceMesh`` and fails in backward (reports/spike-compiled-layouts.md). The region runs twice
    a step, in the forward and in the recomputation. An offloaded block's hooks sit around the compiled call the same
    way (Dynamo breaks the graph at hooks entered inside it); they keep each saved tensor's strides, which Inductor's
    backward asserts (``save_on_host_keeping_strides``), and its region runs once. A block the strategy leaves
    plain is compiled whole (one region). Returns the block's regions per step."""
    wrapper = block.__dict__.get("forward")
    if isinstance(wrapper, BlockForward) and wrapper.option.kind != "none":
        wrapper.forward = torch.compile(wrapper.forward, **options)
        if wrapper.option.kind != "offload":
            return 2
        if wrapper.offload_context is save_on_host:  # the simulator's hooks, swapped in before, stay
            wrapper.offload_context = save_on_host_keeping_strides
        return 1
    block.compile(**options)
    return 1


def budget_backend(budget: float) -> Callable:
    """Inductor with torch's ``activation_memory_budget`` set while it partitions the joint graph (a backend object
    of its own: Dynamo guards on the backend, not on the budget)."""
    from torch._inductor.compile_fx import compile_fx

    return functools.partial(_compile_under_budget, compile_fx, float(budget))


def _compile_under_budget(compile_fx: Callable, budget: float, graph, example_inputs):
    """Under tensor parallel the joint graph takes an opaque object among its inputs (torch 2.13 registers the
    ``DeviceMesh`` and ``ProcessGroup`` that DTensor ops take as opaque types), which the budget's partitioner cannot
    size and refuses ("Cannot compute the size of FakeScriptObject", measured on gloo ranks at tp 2); a mesh or a
    process group holds no activation, so such objects count as zero bytes (torch's own switch for that)."""
    with torch._functorch.config.patch(activation_memory_budget=budget, unsafe_treat_script_objects_as_zero_size=True):
        return compile_fx(graph, example_inputs)


def torch_hidden_warning(step: Callable[[], object]) -> Callable[[], object]:
    """``step`` under ``probes.compiled.dynamos_hidden_warnings``: the warnings torch's own tracing gives (the one
    Dynamo hides itself while tracing a non-leaf input, the one of a traced ``autograd.Function``'s context) stay
    hidden under warnings-as-errors (at the first trace and any recompile)."""

    @functools.wraps(step)
    def quiet() -> object:
        with dynamos_hidden_warnings():
            return step()

    return quiet


FSDP_VIEW_OUTPUT = r"FSDP2-wrapped module \(.*\) returned a view tensor"


@contextlib.contextmanager
def fsdp_compiled_block_outputs() -> Iterator[None]:
    """Keep hidden the warning FSDP2 (torch 2.13, ``_register_pre_backward_hook``) gives at every forward of a compiled
    block it wraps alone: Inductor returns the block's output as a view of its own output buffer
    (``reinterpret_tensor``), and FSDP2 warns that an in-place op on a view would drop the hook that all-gathers the
    block's parameters for backward. No model here updates a block's output in place: a compiled FSDP rank's loss and
    every gradient equal one eager process's, for every strategy (tests/distributed/test_compiled_tensor_parallel.py,
    ``fsdp2``). Exactly that message is ignored, only around a compiled rank's steps; under tensor parallel the block
    returns a sequence-sharded DTensor and FSDP2 does not warn."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=FSDP_VIEW_OUTPUT, category=UserWarning)
        yield


def dynamo_counts() -> tuple[int, int, dict[str, int]]:
    """(graphs compiled, frames compiled, graph-break reasons -> count) since the last reset."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], counters["frames"]["ok"], dict(counters["graph_break"])


def compiled_side(trainer: Trainer, scenario: Scenario, warmup: int, backend: Callable | None = None,
                  on_phase: Callable[[str], None] = lambda _text: None, first: bool = True) -> CompiledSide:
    """``trainer``'s model compiled and warmed up (``warmup`` steps, at least one), outside any dispatch mode.
    Raises ``NotCompiled`` when the warm-up broke a graph, when the first side compiled after a reset (``first``)
    compiled nothing, or when the last warm-up step ran other than the expected compiled regions (a later side
    may reuse graphs compiled for an earlier one: the blocks every_k leaves plain are the reference's blocks)."""
    regions = compile_model(trainer.model, scenario.compile, backend)
    return warmed_up(trainer, scenario, regions, warmup, on_phase, first)


def warmed_up(trainer: Trainer, scenario: Scenario, regions: int, warmup: int,
              on_phase: Callable[[str], None] = lambda _text: None, first: bool = True) -> CompiledSide:
    """The warm-up and checks of ``compiled_side`` for a trainer whose model was compiled already (``regions``
    compiled regions per step): a distributed rank compiles its blocks before ``fully_shard`` wraps them, as
    torchtitan does."""
    trainer.train_step = torch_hidden_warning(trainer.train_step)  # type: ignore[method-assign]
    graphs_before, frames_before, _ = dynamo_counts()
    on_phase("compile (first step)")
    start = time.perf_counter()
    trainer.train_step()
    compile_time_s = time.perf_counter() - start
    for _ in range(max(warmup, 1) - 1):
        trainer.train_step()
    graphs, frames, breaks = dynamo_counts()
    if first and (graphs == graphs_before or frames == frames_before):
        raise NotCompiled(f"{scenario.name}: the warm-up compiled no graph (Dynamo skipped every frame: a dispatch mode "
                          "active, or a frame marked skip); nothing would be measured compiled")
    if breaks:
        reason = next(iter(breaks)).strip().splitlines()[0]
        raise NotCompiled(f"{scenario.name}: {sum(breaks.values())} graph break(s) in the compiled step, the code "
                          f"between the pieces runs eager (first: {reason}); TORCH_LOGS=graph_breaks says where")
    side = CompiledSide(trainer, regions, compile_time_s)
    check_regions(side, read_step(trainer.train_step), scenario.name)  # one more warm-up step, its regions counted
    return side


def read_step(step: Callable[[], object]) -> StepReading:
    """One call of ``step`` under ``torch.profiler``'s memory events: the CPU allocator's most bytes at once over
    what it had at the start, and the compiled regions that ran ("Torch-Compiled Region" events)."""
    return StepReading(*allocator_step(step))


def check_regions(side: CompiledSide, reading: StepReading, name: str) -> StepReading:
    """``reading`` if its step ran the side's compiled regions; ``NotCompiled`` for fewer (a compiled frame ran
    eager) or more (a graph break split a frame)."""
    if reading.compiled_regions != side.regions_per_step:
        why = "a compiled frame ran eager" if reading.compiled_regions < side.regions_per_step else "a graph break split a frame"
        raise NotCompiled(f"{name}: one step ran {reading.compiled_regions} compiled region(s), expected "
                          f"{side.regions_per_step}: {why} (TORCH_LOGS=graph_breaks,recompiles says where)")
    return reading
