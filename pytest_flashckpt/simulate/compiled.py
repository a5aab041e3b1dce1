"""The peak of a ``torch.compile``'d training step without running a kernel: Inductor's own plan, on fake tensors.

A compiled step keeps and allocates other tensors than the eager one. AOTAutograd's min-cut partitioner decides
what crosses from a region's forward into its backward (the saved set), and Inductor decides what exists inside a
region: it fuses pointwise ops into one C++ kernel (the intermediates inside a fused kernel never exist), writes
matmuls into buffers it allocated (``extern_kernels.mm(..., out=buf)``), reuses a freed buffer of the same size,
and frees each buffer after its last use (``del buf``). FX liveness over the graph is not what it allocates.

So the simulator runs torch's real pipeline and only skips what would touch data:

1. The model is built under ``FakeTensorMode`` on the CPU (a ``FakeTensorMode`` is an infra mode, so Dynamo
   compiles under it) and compiled with the stock Inductor backend: Dynamo's trace, AOTAutograd's joint graph,
   Inductor's joint-graph passes and the min-cut partition, the post-grad passes, lowering, scheduling (fusion,
   ``reorder_for_peak_memory``) and the Python wrapper's memory planning are torch's own, unchanged.
2. The one step that is replaced is loading the generated module (``GraphLowering._compile_to_module_lines``):
   its source is executed into a module of ours (not Inductor's code cache) with every generated C++ kernel
   (``async_compile.cpp_pybinding``) a function that does nothing, so no C++ is compiled, and the wrapper's
   allocation helpers made fake-friendly (``empty_strided_cpu`` -> ``torch.empty_strided``, ``reinterpret_tensor``
   -> ``as_strided``). The wrapper's ``call`` then runs as generated: every buffer it allocates, every
   ``extern_kernels`` / fallback op (matmuls, CPU flash attention) and every ``del`` happen in its order, on fake
   tensors.
3. The measured step runs under the simulator's live-storage probe (``simulate.probe``) with
   ``ignore_compile_internals``: Dynamo does not skip frames under it (it would under the plain ``cpu`` probe,
   see ``probes.compiled``) and the probe sees, at run time, exactly the allocations and frees of Inductor's
   wrapper plus the eager parts of the step (embedding and loss outside per-block regions, AdamW).

What this cannot see is memory allocated inside a kernel that the wrapper does not name: scratch buffers of
an aten fallback (CPU flash attention's working buffers) or of a C++ kernel. ``reports/compiled-sim-vs-measured.md``
sizes the difference against the CPU allocator's events. A cache hit would load Inductor's real module, whose
kernels touch data, so a simulation compiles with Inductor's FX graph cache and AOTAutograd's cache off, in one
compile thread.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import time
import types
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import optimization_hint

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.activation.wrapper import drop_role_hooks
from pytest_flashckpt.compile_step import compile_under_wrapper
from pytest_flashckpt.config.model_card import ModelCard
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.core.registry import compiled_strategies, whole_block_strategies
from pytest_flashckpt.models.anatomy import get_anatomy, get_blocks
from pytest_flashckpt.models.cards import load_card
from pytest_flashckpt.models.families import family_of
from pytest_flashckpt.models.hf.card import HFCard
from pytest_flashckpt.probes.compiled import dynamos_hidden_warnings, import_inductor, missing_compiler
from pytest_flashckpt.simulate.kernels import simulated_backend
from pytest_flashckpt.simulate.probe import AttributedStorages
from pytest_flashckpt.simulate.workload import check_workload, dtype_name
from pytest_flashckpt.training import Trainer

SCOPES = ("block", "model")  # torchtitan's per-transformer-block compile, or the whole model as one region
# where a checkpoint sits against its compiled block (config.axes.CompileConfig.ac_wrapper)
AC_WRAPPERS = ("inside", "outside")
# the registry's rows with a simulated_compiled kind (core.registry.COMPILED_SIMULATIONS): strategies whose wrapper
# Dynamo traces inside a compiled region (selective_op's policy reads a matmul's role from the traced node), torch's
# own activation_memory_budget (compile_budget: the partitioner decides) and the budget planner's compiled plan
# (budget: its per-block selective-checkpoint policies, passed as ``policies``)
STRATEGIES = compiled_strategies()
# how a region's inside is counted: "inductor", the wrapper Inductor generates (its fusion, buffers and frees);
# "fx", the alternative it is measured against: every op of the partitioned graphs run one by one (FX liveness),
# Dynamo's aot_eager_decomp_partition backend (Inductor's decompositions and min-cut partitioner, no Inductor)
PLANS = ("inductor", "fx")
# what the checkpoint outside a compiled block is built for (config.axes.CompileConfig.check_scenario): a whole block
# checkpointed, or none (a compiled row's reference)
OUTSIDE_STRATEGIES = (*whole_block_strategies(), "none")


@dataclass
class CompiledRegion:
    """One graph Inductor compiled: a region's forward or backward (``backward``), with what crosses between them."""

    backward: bool
    inputs: list[str]
    input_bytes: dict[str, int]  # placeholder name -> bytes of its storage (two views of one storage: twice)
    calls: int = 0  # times its wrapper ran during the measured step


@dataclass
class _Plans:
    regions: list[CompiledRegion] = field(default_factory=list)


def _no_kernel(*_args) -> None:
    """A generated C++ kernel's stand-in: on fake tensors there is no data to compute."""


def _fake_reinterpret(tensor: torch.Tensor, size, stride, offset_increment: int) -> torch.Tensor:
    # torch._C._dynamo.guards._reinterpret_tensor: a view at storage_offset + offset_increment (outside dispatch,
    # which a fake tensor needs)
    return torch.as_strided(tensor, size, stride, tensor.storage_offset() + offset_increment)


def _fake_empty_strided_cpu(size, stride, dtype) -> torch.Tensor:
    return torch.empty_strided(size, stride, dtype=dtype, device="cpu")


FAKE_RUNTIME = {
    "empty_strided_cpu": _fake_empty_strided_cpu,
    "reinterpret_tensor": _fake_reinterpret,
    "assert_alignment": lambda *_args: None,  # reads a data pointer, which a fake tensor has not
}


def _kernel_names(source: str) -> list[str]:
    """Names the generated module binds to ``async_compile.<kind>(...)``: its compiled kernels."""
    names = []
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute) and isinstance(node.value.func.value, ast.Name)
                and node.value.func.value.id == "async_compile"):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


def _bytes(value) -> int:
    """Bytes of a graph value's storage; a symbolic size (the CPU RNG state a recomputed random op runs under is
    traced with a dynamic length) by the shape environment's hint, the size this run has."""
    if not isinstance(value, torch.Tensor):
        return 0
    return optimization_hint(value.untyped_storage().nbytes(), fallback=0)


@contextlib.contextmanager
def inductor_plans() -> Iterator[_Plans]:
    """While active, Inductor compiles into plan modules (module docstring, point 2); yields what it compiled.
    Inductor is imported here, not at the top: importing it takes seconds and warns once (``import_inductor``),
    and only a simulation that compiles needs it."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config
    from torch._inductor.async_compile import AsyncCompile
    from torch._inductor.codecache import PyCodeCache
    from torch._inductor.graph import GraphLowering

    plans = _Plans()

    def plan_module(graph: GraphLowering, wrapper_code):
        source = wrapper_code.value
        key, path = PyCodeCache.write(source)
        module = types.ModuleType(f"flashckpt_inductor_plan_{key}")
        module.__file__ = path
        module.__dict__.update({**graph.constants, **graph.torchbind_constants})
        exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 (Inductor's own generated wrapper)
        module.__dict__.update({name: _no_kernel for name in _kernel_names(source)}, **FAKE_RUNTIME)
        graph.cache_key, graph.cache_path, graph.cache_linemap = key, path, []
        placeholders = [n for n in graph.orig_gm.graph.nodes if n.op == "placeholder"]
        region = CompiledRegion(bool(graph.is_backward), [n.name for n in placeholders],
                                {n.name: _bytes(n.meta.get("val")) for n in placeholders})
        plans.regions.append(region)
        call = module.call

        def counted(args):
            region.calls += 1
            return call(args)

        module.call = counted
        return module

    with contextlib.ExitStack() as stack:
        # no cache may answer for the plan module: a hit would load the real module, whose kernels touch data
        stack.enter_context(inductor_config.patch(fx_graph_cache=False, fx_graph_remote_cache=False, compile_threads=1))
        stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
        stack.enter_context(_patched(GraphLowering, "_compile_to_module_lines", plan_module))
        stack.enter_context(_patched(AsyncCompile, "cpp_pybinding", lambda self, *a, **k: _no_kernel))
        stack.enter_context(_patched(AsyncCompile, "cpp", lambda self, *a, **k: _no_kernel))
        yield plans


@contextlib.contextmanager
def _patched(owner, name: str, value) -> Iterator[None]:
    original = owner.__dict__[name]
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


class CompiledStepProbe(AttributedStorages):
    """The simulator's live-storage probe, which Dynamo lets compiled code run under (``ignore_compile_internals``:
    off while compiling, on while the compiled wrapper runs, so it counts the wrapper's buffers). The wrapper calls
    higher-order ops too (``run_and_save_rng_state`` around a random op a checkpoint recomputes): the probe counts
    their inputs and outputs like any op's, and the fake mode below it runs them."""

    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


def compile_scope(model: torch.nn.Module, scope: str, backend: str = "inductor", ac_wrapper: str = "inside") -> torch.nn.Module:
    """``model`` compiled per transformer block (each block's call, an ``apply_ac`` wrapper included, as torchtitan
    does) or as a whole; returns what the trainer calls. ``ac_wrapper`` ``outside``: a checkpointed block's own
    forward compiled and its strategy's checkpoint around the compiled call, in eager, as the measured step does
    (``compile_step.compile_under_wrapper``). A strategy's role hooks are taken off first, as the measured compiled
    step does (``activation.wrapper.drop_role_hooks``)."""
    if ac_wrapper not in AC_WRAPPERS:
        raise ValueError(f"unknown ac_wrapper {ac_wrapper!r}; valid: {', '.join(AC_WRAPPERS)}")
    blocks = get_blocks(model, get_anatomy(model))
    drop_role_hooks(blocks)
    if scope == "block":
        for block in blocks:
            if ac_wrapper == "outside":
                compile_under_wrapper(block, {"backend": backend})
            else:
                block.compile(backend=backend)
        return model
    if scope == "model":
        if ac_wrapper == "outside":
            raise ValueError("ac_wrapper outside is per block; scope model compiles the whole model")
        return torch.compile(model, backend=backend)
    raise ValueError(f"unknown compile scope {scope!r}; valid: {', '.join(SCOPES)}")


def unsupported_reason(scenario, device: str = "cpu") -> str | None:
    """Why a compiled scenario (``config.scenario.Scenario``) is not simulated by ``simulate_compiled_step``, or
    None: what the simulator builds is a model card's model with the plain step, sdpa on fake CPU tensors."""
    if device != "cpu":
        return f"the simulator plans Inductor's CPU code; this row ran on {device}"
    if scenario.activation.strategy not in STRATEGIES:
        return (f"activation strategy {scenario.activation.strategy} is not simulated compiled (its registry row "
                f"sets no simulated_compiled; simulated: {', '.join(STRATEGIES)})")
    if scenario.precision != "pure":
        return f"precision {scenario.precision} (autocast) is not simulated compiled"
    if scenario.activation.save_ops is not None:
        return "selective_op with its own save_ops is not simulated compiled (the simulator runs the default policy)"
    if scenario.attention not in ("sdpa", "auto"):
        return f"attention {scenario.attention} is not simulated compiled (the simulator builds sdpa)"
    if scenario.step_impl.optimizer != "adamw" or scenario.step_impl.loss != "plain":
        return "a step other than AdamW with the plain loss is not simulated compiled"
    return None


def _fake_model(config: ModelCard | HFCard, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    """``models.cards.build_model(config, "sdpa")`` under the active fake mode: the parameters made in ``dtype``
    (the default dtype while building: a fake parameter cannot be converted in place afterwards). A Hugging Face
    config's card builds its transformers model with the CPU kernel SDPA picks called as one explicit op
    (``simulate.kernels.simulated_backend``, ``models.hf.attention``): transformers' own ``sdpa`` prepares its causal
    mask by reading tensor values, which fake tensors do not have, and the measured step builds no mask either
    (causal SDPA, no padding), so only the attention call's route differs, not what it allocates."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            with torch.device("cpu"):
                if isinstance(config, HFCard):
                    backend = simulated_backend("sdpa", "cpu", dtype_name(dtype), config.dropout)
                    if backend == "sdpa":
                        raise ValueError(f"{config.name}: attention dropout {config.dropout} takes SDPA's math path on a "
                                         "CPU, whose transformers call reads tensor values; not simulated compiled "
                                         "(set the model's dropout to 0)")
                    return config.build(backend, "cpu", dtype, seed=seed)
                return family_of(config).build(config, "sdpa")
    finally:
        torch.set_default_dtype(default)


def windowed_step(trainer: Trainer, on_forward, on_backward) -> None:
    """``Trainer.train_step``'s work in its three windows (forward, backward, optimizer step); ``on_forward`` and
    ``on_backward`` are called after each (the loss is still alive after the forward)."""
    trainer.model.train()
    x, y = trainer.batch()
    loss = trainer.model(x, y)
    on_forward()
    loss.backward()
    del loss
    on_backward()
    trainer.optimizer.step()
    trainer.scheduler.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.step += 1


def simulate_compiled_step(
    card: ModelCard | HFCard | str,
    batch: int,
    seq: int,
    strategy: str = "none",
    scope: str = "block",
    dtype: str | torch.dtype = "float32",
    seed: int = 0,
    plan: str = "inductor",
    k: int = 2,
    budget: float | None = None,
    policies: tuple | None = None,
    ac_wrapper: str = "inside",
) -> dict:
    """One warmed-up training step of ``card`` compiled per ``scope`` with activation ``strategy``, on fake CPU
    tensors: bytes added over the training state at the step's peak (``peak_bytes``), at the forward + backward
    peak (``fwd_bwd_peak_bytes``) and after the forward (``forward_kept_bytes``: the loss and what every region saved
    for its backward); per compiled graph (``regions``): forward or backward, calls per step, the bytes of its
    inputs and, for a backward, the partitioner's saved set (``saved_bytes``: inputs that are not tangents;
    ``saved_activation_bytes``: those not forward inputs, i.e. made inside the region); wall times. ``plan``
    ``fx`` counts the regions by FX liveness instead (``PLANS``; no ``regions`` rows), the alternative measured in
    ``reports/compiled-sim-vs-measured.md``. ``k`` is every_k's; ``budget`` compile_budget's
    ``activation_memory_budget`` (set while the regions compile). ``state_bytes``: the training state the step
    starts from (parameters, gradients, AdamW state), so ``state_bytes + peak_bytes`` is the step's whole peak.
    ``policies``: budget's, the compiled plan's per-block ``SavePolicy`` (or None: no checkpoint), installed as the
    measured step installs them (``compile_policy.install_policy_forwards``). ``ac_wrapper`` ``outside``: the
    strategy's checkpoint around each compiled block (``compile_scope``), for the whole-block strategies."""
    started = time.perf_counter()
    config = load_card(card) if isinstance(card, str) else card
    name = dtype_name(dtype)
    check_workload(config, batch, seq)
    if scope not in SCOPES:
        raise ValueError(f"unknown compile scope {scope!r}; valid: {', '.join(SCOPES)}")
    if strategy not in STRATEGIES:
        raise ValueError(f"activation strategy {strategy!r} is not simulated compiled; valid: {', '.join(STRATEGIES)} "
                         "(the registry's rows with simulated_compiled)")
    if (strategy == "budget") != (policies is not None):
        raise ValueError("policies (the compiled plan's, compile_policy.plan_compiled) are budget's and required by it; "
                         f"got strategy {strategy!r} with {'no ' if policies is None else ''}policies")
    if (strategy == "compile_budget") != (budget is not None):
        raise ValueError("budget (torch's activation_memory_budget) is compile_budget's and required by it; "
                         f"got strategy {strategy!r} with budget {budget!r}")
    if plan not in PLANS:
        raise ValueError(f"unknown region plan {plan!r}; valid: {', '.join(PLANS)}")
    if ac_wrapper == "outside" and strategy not in OUTSIDE_STRATEGIES:
        raise ValueError(f"ac_wrapper outside is simulated for {', '.join(OUTSIDE_STRATEGIES)} (a whole block "
                         f"checkpointed, or none), as the measured step builds it; got strategy {strategy!r}")
    import_inductor()
    missing = missing_compiler() if plan == "inductor" else None
    if missing is not None:  # Inductor's CPU codegen probes the vector ISA with the compiler, kernels stubbed or not
        raise RuntimeError(missing)
    torch._dynamo.reset()
    try:
        # allow_non_fake_inputs: a checkpoint recomputing a random op inside a region runs it under the real CPU RNG
        # state torch.get_rng_state() returns (run_with_rng_state), as the real step does
        with contextlib.ExitStack() as stack:
            if budget is not None:  # what the measured step's budget backend sets while Inductor partitions
                stack.enter_context(torch._functorch.config.patch(activation_memory_budget=float(budget)))
            stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
            plans = stack.enter_context(inductor_plans() if plan == "inductor" else contextlib.nullcontext(_Plans()))
            model = _fake_model(config, getattr(torch, name), seed)
            if strategy == "budget":
                from pytest_flashckpt.activation.budget.compile_policy import install_policy_forwards

                install_policy_forwards(model, policies)  # type: ignore[arg-type]
            elif strategy not in ("none", "compile_budget"):
                apply_ac(model, ActivationConfig(strategy=strategy, k=k))
            backend = "inductor" if plan == "inductor" else "aot_eager_decomp_partition"
            trainer = Trainer.create(compile_scope(model, scope, backend, ac_wrapper), batch, seq, seed=seed)
            with dynamos_hidden_warnings():
                trainer.train_step()  # compiles every region's forward and backward; AdamW's state exists after it
            compiled = time.perf_counter()
            for region in plans.regions:
                region.calls = 0
            probe = CompiledStepProbe("cpu")
            for t in trainer.state_tensors():
                probe.add_resident(t, "parameters")
            start = probe.live_bytes
            seen: dict[str, int] = {}
            with probe:
                windowed_step(trainer, lambda: seen.setdefault("forward", probe.live_bytes),
                              lambda: seen.setdefault("fwd_bwd_peak", probe.peak_bytes))
    finally:
        torch._dynamo.reset()  # no compiled fake model stays in Dynamo's caches, whatever happened
    return {
        "card": config.name, "batch": batch, "seq": seq, "strategy": strategy, "scope": scope, "dtype": name, "plan": plan,
        "ac_wrapper": ac_wrapper,
        "state_bytes": start, "peak_bytes": probe.peak_bytes - start, "fwd_bwd_peak_bytes": seen["fwd_bwd_peak"] - start,
        "forward_kept_bytes": seen["forward"] - start,
        "regions": [_region_row(r) for r in plans.regions],
        "compile_s": compiled - started, "seconds": time.perf_counter() - started,
    }


def _region_row(region: CompiledRegion) -> dict:
    row = {"backward": region.backward, "calls": region.calls, "input_bytes": sum(region.input_bytes.values())}
    if region.backward:
        saved = [n for n in region.inputs if not n.startswith("tangents")]
        row["saved_bytes"] = sum(region.input_bytes[n] for n in saved)
        row["saved_activation_bytes"] = sum(region.input_bytes[n] for n in saved if not n.startswith("primals"))
    return row


def compiled_peak_check(card: ModelCard | str, batch: int, seq: int, dtype: str | torch.dtype = "float32",
                        seed: int = 0):
    """The compiled plan's check (``compile_policy.plan_compiled(..., compiled_peak=...)``): per-block policies ->
    the whole-step peak bytes (``state_bytes + peak_bytes``) of ``card``'s step at (batch, seq) compiled per block
    under them, simulated (``simulate_compiled_step`` with strategy ``budget``). On the micro card of
    ``tests/activation/test_compile_policy.py`` it equals the CPU allocator's peak to the byte
    (``reports/compiled-plan-check.md``). Each policies' peak is simulated once per check (cached: the plan prices
    the same fixed strategies at every budget of a shape, ``compile_policy.plan_compiled``)."""

    @functools.cache
    def simulated(policies: tuple) -> int:
        row = simulate_compiled_step(card, batch, seq, "budget", "block", dtype=dtype, seed=seed, policies=policies)
        return row["state_bytes"] + row["peak_bytes"]

    def peak(policies: tuple) -> int:
        return simulated(tuple(policies))

    return peak
