"""One rank of a parallel layout, simulated by the real engine: torch's ``parallelize_module`` and ``fully_shard``
(``distributed.tensor_parallel``, the code the gloo and NCCL ranks run) in one process under ``FakeTensorMode``
with torch's fake process group (``init_process_group("fake")``: collectives return at once, every shape is the
rank's real one). What the rank holds is what torch builds: DTensor local shards, FSDP2's padded shards and its
all-gather and reduce-scatter buffers, freed when FSDP2 frees them, counted phase by phase by the rank probe of a
real rank (``tensor_parallel.memory_step``). No tensor is allocated, so a 70B card runs on a laptop; a deep card is
read off the line through a few shallower depths (``simulate.layer_extrapolation``), so a 405B step takes seconds.

Two things differ from a real rank, both outside what is counted:

- Meshes are built before fake mode is entered (``DeviceMesh`` reads its rank tensor's values), and a mesh FSDP2
  builds while laying out a 2D model (it concatenates the dp_shard and tp meshes inside ``fully_shard``) is built
  outside fake mode too (``_real_meshes``): mesh tensors are a few integers, not a rank's memory.
- The parameters are created in their dtype (``torch.set_default_dtype``) instead of ``build_model``'s final
  ``model.to(dtype)``, which cannot swap a fake parameter; same seed, same shapes.

Only the live tensors are simulated: the CPU allocator of a gloo rank also holds gloo's staging copies of the
collectives (outside the dispatcher; ``distributed.memory``), measured apart. The fake process group is the process's default
group while a depth runs and is destroyed after it, so one process may simulate ranks one after the other (not
while another process group is up).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.distributed import _functional_collectives
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import _collective_utils as _dtensor_collectives
from torch.distributed.tensor import _decompositions as _dtensor_decompositions
from torch.fx.experimental.proxy_tensor import get_proxy_mode
from torch.testing._internal.distributed.fake_pg import FakeStore

from pytest_flashckpt.config.axes import CompileConfig
from pytest_flashckpt.config.layout import Layout
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.distributed import context_parallel
from pytest_flashckpt.distributed import tensor_parallel as tp
from pytest_flashckpt.distributed.memory import ShardedLiveTensorProbe
from pytest_flashckpt.models.families import family_of
from pytest_flashckpt.simulate.layer_extrapolation import line_through, sample_depths
from pytest_flashckpt.simulate.rank_probe import ResizeTrackingRankProbe


def _eager_are_we_tracing() -> bool:
    """``_functional_collectives._are_we_tracing`` without its "fake mode is on, so we are compiling" guess: this
    fake run is eager, so a collective's result is wrapped in an ``AsyncCollectiveTensor`` as on a real rank."""
    return torch.compiler.is_compiling() or get_proxy_mode() is not None


@contextlib.contextmanager
def _eager_collectives():
    """While active, functional collectives under fake mode behave as in an eager real run. Without it they are
    waited on at once (``wait_tensor``, the traced form) instead of wrapped (``_wrap_tensor_autograd``), and the
    all-gathered activations of tensor parallel are freed at other ops: measured on the 2-block Llama of
    the spike's TP plan (reports/spike-fake-layouts.md), where the fake rank's forward+backward peak was 4.4 % over
    the gloo rank's. With it the fake and the gloo rank run the same aten and c10d ops in the same order (checked
    op by op on the 2-block Llama of tests/distributed at tp 2; docs/layouts.md)."""
    modules = [_functional_collectives, _dtensor_decompositions, _dtensor_collectives]
    saved = [m._are_we_tracing for m in modules]
    wrap, wait = _functional_collectives._wrap_tensor_autograd, _functional_collectives.wait_tensor
    for m in modules:
        m._are_we_tracing = _eager_are_we_tracing
    _functional_collectives._wrap_tensor_autograd = functools.partial(_wrap_as_a_real_rank, wrap)
    _functional_collectives.wait_tensor = functools.partial(_waited_as_a_real_rank, wait)
    try:
        yield
    finally:
        for m, original in zip(modules, saved):
            m._are_we_tracing = original
        _functional_collectives._wrap_tensor_autograd, _functional_collectives.wait_tensor = wrap, wait


def _wrap_as_a_real_rank(wrap, result: torch.Tensor) -> torch.Tensor:
    """A collective's result wrapped as on a real rank: ``AsyncCollectiveTensor(result)``, which holds ``result``
    and allocates nothing. torch's fake kernel of the ``_wrap_tensor_autograd`` op returns ``empty_like(result)``
    instead, a second buffer of the result's size that lived beside it while the wrapper was made: where that fell
    on a peak the fake rank read one gathered buffer above the gloo rank (the all-gathered K/V of context
    parallel's ring, reports/spike-cp-ranks.md). A result that requires grad keeps torch's op (its autograd
    passes gradients through the wrapper)."""
    if result.requires_grad:
        return wrap(result)
    return _functional_collectives.AsyncCollectiveTensor(result)


def _waited_as_a_real_rank(wait, result: torch.Tensor) -> torch.Tensor:
    """An ``AsyncCollectiveTensor``'s wait as on a real rank, where ``wait_tensor`` returns the result itself (the
    fake process group's collectives are complete when issued); torch's meta kernel of the op returns
    ``empty_like(result)``, a second buffer the gloo rank never holds. Traced by Dynamo (a compiled block), torch's
    ``wait`` itself: its ``wait_tensor`` node is in the graph a real rank compiles, and Inductor schedules the
    collectives around it (without it the ring's all-gather in a recomputed backward moved earlier and a compiled
    stage's simulated peak read up to 467,584 B under the gloo rank's, reports/spike-compiled-cp-stages.md)."""
    if torch.compiler.is_compiling():
        return wait(result)
    return result


@contextlib.contextmanager
def _real_meshes():
    """While active, every ``DeviceMesh`` is built outside fake mode (its rank tensor stays a real tensor)."""
    init = DeviceMesh.__init__

    @functools.wraps(init)
    def real_init(self, *args, **kwargs):
        with unset_fake_temporarily():
            init(self, *args, **kwargs)

    DeviceMesh.__init__ = real_init
    try:
        yield
    finally:
        DeviceMesh.__init__ = init


def forget_meshes() -> None:
    """Clear DTensor's caches of sharding propagation (torch's C++ dispatch cache and the Python one) and of
    redistribute plans. Their entries hold the ``DeviceMesh`` of the run that filled them, and a mesh of the next
    fake process group compares equal to it (same ranks, shape and names: ``DeviceMesh.__eq__``) but names other
    process groups: without this, a second simulated rank in the same process (rank 2 after rank 0 of a pp 2 x
    tp 2 layout) ran its collectives on the first run's destroyed groups (``RuntimeError: Could not resolve the
    process group registered under the name 7``)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import _redistribute

    torch._C._clear_DTensor_sharding_propagator_cache()
    propagator = DTensor._op_dispatcher.sharding_propagator
    propagator.propagate_op_sharding.cache_clear()
    propagator._propagate_tensor_meta_cached.cache_clear()
    _redistribute._gen_transform_infos.cache_clear()
    _redistribute.clear_redistribute_planner_cache()


def _build_fake(card, backend: str, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    """``models.cards.build_model`` under fake mode: the parameters created in ``dtype`` from the same seed."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            with torch.device("cpu"):
                return family_of(card).build(card, backend)
    finally:
        torch.set_default_dtype(default)


def simulate_rank(
    card,
    layout: Layout,
    *,
    batch_size: int,
    seq_len: int,
    strategy: str = "none",
    k: int = 2,
    dtype: torch.dtype = torch.float32,
    precision: str = "pure",
    rank: int = 0,
    seed: int = 0,
    backend: str = "sdpa",
    extrapolate: bool = True,
    probe_class: type[ShardedLiveTensorProbe] = ResizeTrackingRankProbe,
    foreach: bool | None = None,
    warmup: str = "primed",
    compile: CompileConfig | None = None,
    budget: float | None = None,
) -> dict:
    """Rank ``rank`` of ``layout``: warmed up (``warm_up``: AdamW's state exists after it), then one step measured in the
    two windows of a real rank. Bytes are the rank's live tensors; ``*_s`` are this process's wall times.

    ``extrapolate`` (default): a card deeper than a few blocks is simulated at a few shallower depths and its byte
    counts read off the line through them (``simulate.layer_extrapolation``; ``simulated_depths`` names them,
    ``extrapolated`` says whether the line held), else simulated whole. ``probe_class``: the rank probe
    (``simulate.rank_probe``'s by default, the same bytes as ``distributed.memory``'s, faster). ``foreach``: AdamW's
    implementation (None: torch's pick for the device, per-tensor on a CPU; True: the multi-tensor one CUDA runs).
    ``warmup``: how the rank reaches its measured step (``warm_up``; ``"step"`` runs a real first step).

    ``compile`` (enabled): a compiled rank, built as ``distributed.rank`` builds one (the embedding's output settled
    under tensor parallel, each block compiled before ``fully_shard``, ``budget`` as compile_budget's
    ``activation_memory_budget``), its regions compiled by torch's Inductor into plans whose kernels do nothing
    (``simulate.compiled.inductor_plans``); it warms up with two real steps (compiling), is probed by
    ``rank_probe.CompiledRankProbe`` and simulated whole (no depth extrapolation). Against a gloo rank read by the
    same probe: window starts and the optimizer peak equal to the byte, the forward+backward peak within what
    ``reports/spike-compiled-fake-ranks.md`` measured."""
    if dist.is_initialized():
        raise RuntimeError("simulate_rank needs a process without a process group (it starts the fake one)")
    layout.check_card(card)
    layout.check_batch(batch_size)
    layout.check_sequence(seq_len)
    if layout.cp > 1:  # the ring runs the CPU flash op, as a gloo rank's does (distributed.context_parallel)
        backend = context_parallel.ring_backend("cpu")
    run = functools.partial(_simulate_whole, layout=layout, batch_size=batch_size, seq_len=seq_len, strategy=strategy,
                            k=k, dtype=dtype, precision=precision, rank=rank, seed=seed, backend=backend,
                            probe_class=probe_class, foreach=foreach, warmup=warmup, compile=compile, budget=budget)
    compiled = compile is not None and compile.enabled  # simulated whole: each depth would compile again
    depths = sample_depths(card.n_layer, strategy, k) if extrapolate and _has_depth(card) and not compiled else []
    records: dict[int, dict] = {}
    for depth in depths:
        records[depth] = run(dataclasses.replace(card, n_layer=depth))
        line = line_through(records, card.n_layer)
        if line is not None:
            return _extrapolated(records, line, card.n_layer)
    record = run(card)
    if records:  # the line did not hold at the sampled depths: the whole card, and what the samples cost
        record.update(_sample_times(records, "sample_"))
    record.update(extrapolated=False, simulated_depths=[*records, card.n_layer])
    return record


def _has_depth(card) -> bool:
    """A card whose depth is its dataclass field ``n_layer`` (every family's card here; a Hugging Face config's card
    is simulated whole)."""
    return dataclasses.is_dataclass(card) and any(f.name == "n_layer" for f in dataclasses.fields(card))


TIME_KEYS = ("layout_s", "warm_step_s", "measured_step_s")
WARMUPS = ("primed", "step")  # how a simulated rank reaches its measured step (``warm_up``)


def warm_up(trainer, parameters: list[torch.Tensor], warmup: str) -> None:
    """Bring a simulated rank to the state its measured step starts from: what a first training step leaves behind.

    ``"step"`` runs that step (every microbatch forward and backward, then the optimizer). ``"primed"`` (the
    default of every simulation) leaves the same live tensors without the forward and backward: each trainable
    parameter gets a zero gradient of its own shape, placement and dtype, and the optimizer and scheduler step, so
    AdamW's state exists as after a real step; the gradients are then dropped (``zero_grad(set_to_none=True)``,
    as the step's end drops them). On a fake rank that forward and backward is a large share of a simulation's time
    (reports/warm-up-speed.md) and changes no tensor that outlives the step: tests/simulate/test_warm_up.py checks every window's start and peak
    equal to the byte under both, for FSDP, TP, 2D, mixed precision and each pipeline schedule (the pipeline's
    receive buffers are prepared by the schedule's own stage initialisation, ``simulate.pipeline``)."""
    if warmup not in WARMUPS:
        raise ValueError(f"warmup must be one of {WARMUPS}, got {warmup!r}")
    if warmup == "step":
        trainer.train_step()
        return
    for param in parameters:
        if param.requires_grad:
            param.grad = torch.zeros_like(param)
    trainer.optimizer.step()
    trainer.scheduler.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.step += 1


def _sample_times(records: dict[int, dict], prefix: str = "") -> dict[str, float]:
    return {f"{prefix}{key}": sum(r[key] for r in records.values()) for key in TIME_KEYS}


def _extrapolated(records: dict[int, dict], line: dict[str, int], n_layer: int) -> dict:
    """The record of depth ``n_layer`` from the line: its byte counts, the samples' summed wall times."""
    last = records[max(records)]
    return {**last, **line, **_sample_times(records), "extrapolated": True, "simulated_depths": list(records),
            "n_layer": n_layer}


def _simulate_whole(card, *, layout: Layout, batch_size: int, seq_len: int, strategy: str, k: int, dtype: torch.dtype,
                    precision: str, rank: int, seed: int, backend: str,
                    probe_class: type[ShardedLiveTensorProbe], foreach: bool | None, warmup: str = "primed",
                    compile: CompileConfig | None = None, budget: float | None = None) -> dict:
    """One fake process group, the card built and laid out, warmed up (``warm_up``) and the probed step. A compiled
    rank (``compile``, see ``simulate_rank``) compiles into Inductor's plans, warms up with two real steps and is
    read by ``rank_probe.CompiledRankProbe``."""
    compiled = _Compiled(layout, strategy, compile, budget) if compile is not None and compile.enabled else None
    started = time.perf_counter()
    forget_meshes()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=layout.world_size)
    try:
        mesh = tp.make_mesh(layout)
        with contextlib.ExitStack() as stack:
            for context in (FakeTensorMode(allow_non_fake_inputs=True), _real_meshes(), _eager_collectives()):
                stack.enter_context(context)
            for context in () if compiled is None else compiled.contexts():
                stack.enter_context(context)
            model = _build_fake(card, backend, torch.float32 if precision == "mixed" else dtype, seed)
            trainer, _ = tp.build_trainer(card, layout, mesh, batch_size=batch_size, seq_len=seq_len, seed=seed,
                                          dtype=dtype, activation=ActivationConfig(strategy=strategy, k=k, budget=budget),
                                          precision=precision, model=model, foreach=foreach,
                                          before_shard=None if compiled is None else compiled.compile_blocks)
            built = time.perf_counter()
            if compiled is None:
                warm_up(trainer, list(trainer.model.parameters()), warmup)
            else:
                compiled.warm_up(trainer)
                probe_class = compiled.probe_class
            warm = time.perf_counter()
            record = tp.memory_step(trainer, probe_class=probe_class)
        done = time.perf_counter()
    finally:
        dist.destroy_process_group()
        forget_meshes()
        if compiled is not None:
            torch._dynamo.reset()  # no compiled fake model stays in Dynamo's caches
    record.update(rank=rank, layout_s=built - started, warm_step_s=warm - built, measured_step_s=done - warm,
                  n_layer=card.n_layer)
    return record


class _Compiled:
    """What a compiled rank adds to ``_simulate_whole``: each block compiled as ``distributed.rank`` compiles it (the
    embedding's output settled under tensor parallel; compile_budget's backend), into Inductor's plans whose kernels
    do nothing (``simulate.compiled.inductor_plans``), two real warm-up steps, the probe made for compiled code."""

    def __init__(self, layout: Layout, strategy: str, compile: CompileConfig, budget: float | None) -> None:
        from pytest_flashckpt import compile_step
        from pytest_flashckpt.probes.compiled import import_inductor
        from pytest_flashckpt.simulate.rank_probe import CompiledRankProbe

        reason = compile_step.compiler_missing()
        if reason is not None:  # Inductor's CPU codegen probes the vector ISA with the compiler, kernels stubbed or not
            raise RuntimeError(reason)
        import_inductor()
        torch._dynamo.reset()
        self.layout, self.compile = layout, compile
        self.backend = compile_step.budget_backend(budget) if strategy == "compile_budget" else None  # type: ignore[arg-type]
        self.probe_class = CompiledRankProbe

    def contexts(self) -> tuple:
        """Inductor's plans whose kernels do nothing, and FSDP2's warning on Inductor's output views kept hidden
        (FSDP alone: ``compile_step.fsdp_compiled_block_outputs``)."""
        from pytest_flashckpt import compile_step
        from pytest_flashckpt.simulate.compiled import inductor_plans

        return inductor_plans(), compile_step.fsdp_compiled_block_outputs()

    def compile_blocks(self, model: torch.nn.Module) -> None:
        from pytest_flashckpt import compile_step

        if self.layout.tp > 1:
            tp.settle_embedding_output(model)
        compile_step.compile_model(model, self.compile, self.backend)

    def warm_up(self, trainer) -> None:
        from pytest_flashckpt.probes.compiled import dynamos_hidden_warnings

        with dynamos_hidden_warnings():
            for _ in range(2):  # the first compiles; the second runs what the measured step runs
                trainer.train_step()


def main(argv: list[str] | None = None) -> None:
    """``python -m pytest_flashckpt.simulate.fake_ranks CARD --layouts 1x2,2x2 ...``: on the last line of stdout,
    JSON ``{"DPxTP": {strategy: record}}`` (what the tests and benchmarks/fake_layouts.py run in a fresh process)."""
    import argparse
    import json

    from pytest_flashckpt.models.cards import load_card

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("card")
    parser.add_argument("--overrides", default="{}", help="card overrides as JSON, e.g. '{\"n_layer\": 2}'")
    parser.add_argument("--layouts", default="1x2", help="comma-separated dp_shard x tp layouts, e.g. 1x2,2x2")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--strategies", default="none", help="comma-separated activation strategies")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--precision", default="pure", choices=("pure", "mixed"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-extrapolate", action="store_true", help="simulate the card whole (no depth extrapolation)")
    parser.add_argument("--foreach", action="store_true", help="AdamW foreach (CUDA's default) instead of torch's CPU pick")
    parser.add_argument("--warmup", default="primed", choices=WARMUPS, help="how the rank reaches its measured step (warm_up)")
    args = parser.parse_args(argv)
    card = load_card(args.card, **json.loads(args.overrides))
    records: dict[str, dict] = {}
    for name in args.layouts.split(","):
        dp, _, tp_size = name.partition("x")
        layout = Layout(dp_shard=int(dp), tp=int(tp_size))
        records[name] = {
            strategy: simulate_rank(card, layout, batch_size=args.batch, seq_len=args.seq, strategy=strategy,
                                    dtype=getattr(torch, args.dtype), precision=args.precision, seed=args.seed,
                                    extrapolate=not args.no_extrapolate, foreach=True if args.foreach else None,
                                    warmup=args.warmup)
            for strategy in args.strategies.split(",")
        }
    print(json.dumps(records))


if __name__ == "__main__":
    main()
