"""Run one scenario end to end in this process (the in-process runner): build -> apply strategies -> memory pass
-> timing pass -> FLOPs -> checkpoint pass -> ``Result``. Nothing here imports pytest: the plugin and the
``flashckpt`` fixture are thin layers on top.

Every ratio is against the scenario's *reference* (same model, kernel, batch and sequence; no activation
checkpointing; a plain synchronous save) measured in the same run. The reference's trainer and its deterministic
measurements (peak memory, FLOPs, the reference save) are cached per run, keyed by the reference's configuration;
a scenario that trains the reference's step shares them (docs/architecture.md, "Each fact of a scenario is computed
once").
"""

from __future__ import annotations

import dataclasses
import shutil
import statistics
import tempfile
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pytest_flashckpt.config.scenario import Scenario
from pytest_flashckpt.config.step_impl import StepImpl, card_with_norm
from pytest_flashckpt.core.files import work_folder
from pytest_flashckpt.core.metrics import Measurements
from pytest_flashckpt.models.attention import OpNameRecorder, detect_kernel, resolve_backend
from pytest_flashckpt.models.cards import build_model
from pytest_flashckpt.core.result import Result
from pytest_flashckpt.report.compiled import NOT_SIMULATED
from pytest_flashckpt.runner.compiled import check_can_compile, measure_compiled
from pytest_flashckpt.runner.confirm import confirmation, note_confirmation
from pytest_flashckpt.runner.context import RunContext, SkipScenario
from pytest_flashckpt.runner.outcome import recorded
from pytest_flashckpt.runner.passes import peak_pass, timing_pass
from pytest_flashckpt.training import Trainer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def run_scenario(scenario: Scenario, ctx: RunContext) -> Result:
    """Measure one scenario in this process (``runner.runners.InProcessRunner``); a scenario this hardware cannot run
    comes back ``skipped`` with the reason, one that broke comes back ``error`` with the exception (its traceback in
    ``notes``), so a run's record is whole. A distributed or simulated scenario is refused: its runner is another
    (``runner.runners.runner_for``)."""
    if scenario.world_size > 1 or scenario.simulate.enabled:
        kind = "distributed (world_size > 1)" if scenario.world_size > 1 else "simulated (simulate.enabled)"
        raise ValueError(f"scenario {scenario.name!r} is {kind}: run_scenario measures in this process only; "
                         "use runner.runners.measure_scenario, which picks its runner")
    result = Result(scenario.suite, scenario.name, "measured", scenario, device=str(ctx.device), probe=ctx.probe)
    return recorded(result, lambda: _measure(scenario, ctx, result), hint=lambda: _disk_hint(scenario, ctx))


LOW_DISK_BYTES = 64 * 2**20  # a work folder this close to full is the likely cause of a failed save


def _disk_hint(scenario: Scenario, ctx: RunContext) -> str:
    """When a checkpointing scenario broke and its work folder's disk is (nearly) full, say so: torch's own
    message for a full disk is a write error such as "unexpected pos", which never names the disk."""
    if "checkpoint" not in scenario.measure:
        return ""
    folder = ctx.workdir or Path(tempfile.gettempdir())
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return ""
    if free >= LOW_DISK_BYTES:
        return ""
    return (f" (the checkpoint work folder {folder} has {free / 2**20:.1f} MiB free: out of disk space? free some, or "
            "pass --flashckpt-workdir=FOLDER on a larger disk)")


def _build_trainer(scenario: Scenario, ctx: RunContext, backend: str) -> Trainer:
    if scenario.model.hf is not None:  # a Hugging Face model from its config (pytest_flashckpt.models.hf)
        from pytest_flashckpt.models.hf import HFUnavailable, build_hf_model

        spec = scenario.model
        try:
            model = build_hf_model(spec.hf, backend, ctx.device, DTYPES[scenario.dtype], seed=scenario.seed,  # type: ignore[union-attr]
                                   dropout=spec.dropout, anatomy=spec.anatomy, seq_len=scenario.seq_len)  # type: ignore[union-attr]
        except HFUnavailable as exc:  # the optional extra is not installed: skipped, with the install line
            raise SkipScenario(str(exc)) from None
        return Trainer.create(model, scenario.batch_size, scenario.seq_len, seed=scenario.seed)
    card = card_with_norm(ctx.cards.card(scenario.card, scenario.model.dropout), scenario.step_impl.norm)  # seq_len vs block_size: preflight() and GPT.forward check it
    if ctx.device.type == "cpu" and not card.allocate_on_cpu:
        raise SkipScenario(
            f"model card {card.name!r} ({card.num_params() / 1e9:.1f}B parameters) is only built on the meta device "
            "on a CPU; run it on a GPU"
        )
    mixed = scenario.precision == "mixed"  # float32 master weights, the forward autocast to dtype
    model = build_model(card, backend, ctx.device, torch.float32 if mixed else DTYPES[scenario.dtype], seed=scenario.seed)
    return Trainer.create(model, scenario.batch_size, scenario.seq_len, seed=scenario.seed,
                          autocast=DTYPES[scenario.dtype] if mixed else None, impl=scenario.step_impl)


def _apply_activation(trainer: Trainer, scenario: Scenario, result: Result):
    """The scenario's activation strategy on ``trainer``'s model; returns the compiled plan for ``budget`` on
    compiled blocks (``_plan_compiled``), else None."""
    if scenario.activation.strategy == "none":
        return None
    if scenario.activation.strategy == "compile_budget":  # compile's partitioner decides (runner.compiled.budget_backend)
        result.notes.append(f"activation: torch.compile's activation_memory_budget {scenario.activation.budget}")
        return None
    if scenario.activation.strategy == "budget" and scenario.compile.enabled:
        return _plan_compiled(trainer, scenario, result)
    from pytest_flashckpt.activation import StrategyUnavailable, apply_ac

    source = None
    if scenario.activation.strategy == "budget":
        from pytest_flashckpt.simulate.costs import cpu_costs_for, cuda_costs_for

        if next(trainer.model.parameters()).device.type == "cuda":
            if scenario.model.hf is not None:
                raise SkipScenario("budget on a GPU plans from costs simulated from a model card; a Hugging Face model "
                                   "has no card to simulate: plan it on a CPU (costs measured on the model itself)")
            source = cuda_costs_for(trainer.model)  # no exact probe on a GPU: costs simulated on meta, weights timed here
        elif scenario.model.hf is None:  # a Hugging Face model has no card to simulate: its costs are measured
            source = cpu_costs_for(trainer.model)  # byte-equal to measured costs, ~25x faster; None: measured
    try:
        applied = apply_ac(trainer.model, scenario.activation, shape=(scenario.batch_size, scenario.seq_len), source=source)
    except StrategyUnavailable as exc:
        raise SkipScenario(str(exc)) from None
    result.notes.append(f"activation: {applied.describe()}")
    return None


def _plan_compiled(trainer: Trainer, scenario: Scenario, result: Result):
    """``budget`` on compiled blocks: the plan is one selective-checkpoint policy per block
    (``activation.budget.compile_policy.plan_compiled``: must-save / prefer-recompute per op, priced on the step's
    peak), which each compiled block's checkpoint runs, rather than the eager planner's switchable blocks."""
    from pytest_flashckpt.activation.budget.compile_policy import install_policy_forwards, plan_compiled
    from pytest_flashckpt.activation.options import FULL, NONE
    from pytest_flashckpt.simulate.costs import SimulatedCosts

    model = trainer.model
    if scenario.model.hf is not None or next(model.parameters()).device.type != "cpu" or getattr(model, "backend", None) != "sdpa":
        raise SkipScenario("a compiled budget plan is built for a model card's model with sdpa on a CPU (its step's "
                           "none and full costs simulated from the card); use compile_budget here, or budget eager")
    from pytest_flashckpt.simulate.compiled import compiled_peak_check

    dtype = next(model.parameters()).dtype
    source = SimulatedCosts(model.config, dtype, "sdpa", "cpu", options=(NONE, FULL))
    # checked compiled: the plan's step simulated (partitioner's saved set, Inductor's memory plan) and re-planned
    # down the front while over the budget, then priced against the fixed strategies that recompute less
    # (compile_policy.plan_compiled's compiled_peak)
    check = compiled_peak_check(model.config, scenario.batch_size, scenario.seq_len, dtype, seed=scenario.seed)
    plan = plan_compiled(model, scenario.activation.budget, (scenario.batch_size, scenario.seq_len), source,  # type: ignore[arg-type]
                         compiled_peak=check)
    install_policy_forwards(model, plan.policies)
    s = plan.shape_plan
    for key, value in (("budget_bytes", s.budget_bytes), ("budget_predicted_peak_bytes", plan.predicted_peak),
                       ("budget_min_peak_bytes", s.min_peak), ("budget_none_peak_bytes", s.none_peak),
                       ("budget_compiled_check_peak_bytes", plan.compiled_peak), ("budget_replans", plan.replans)):
        result.record(key, value)
    kind = f"fixed `{plan.fixed}` as per-block policies" if plan.fixed else "per-block selective-checkpoint policies"
    result.notes.append(f"activation: compiled budget plan ({kind}) {plan.describe()}"
                        + ("" if plan.exact_menus else "; a block's menu was greedy, not exact"))
    return plan


@dataclass(frozen=True)
class _Warm:
    """A built, warmed-up trainer and the op names of its first step (``detect_kernel`` reads them)."""

    trainer: Trainer
    op_names: frozenset[str]
    notes: tuple[str, ...] = ()  # what applying the activation strategy noted on the result of the scenario that built it


def _counts_flops(scenario: Scenario) -> bool:
    """Whether ``scenario`` reads FLOP counts (its own and its reference's): ``_flops_and_throughput`` runs."""
    return "flops" in scenario.measure or "timing" in scenario.measure


def _warm(trainer: Trainer, scenario: Scenario, ctx: RunContext, count: bool, notes: tuple[str, ...] = ()) -> _Warm:
    """``trainer`` warmed up (``_warmup``). With ``count``, the forward and backward of its first step are
    FLOP-counted when that step is the one ``count_step`` counts (``activation.flops.counts_as_measured``), and the
    count is the run's ``flop count`` of ``scenario``: no separate counted forward + backward later."""
    from pytest_flashckpt.activation.flops import StepCount, counts_as_measured

    counting = StepCount() if count and counts_as_measured(trainer) else None
    warm = _Warm(trainer, frozenset(_warmup(trainer, max(scenario.warmup, 1), counting)), notes)
    if counting is not None:
        ctx.cached("flop count", scenario, counting.flops)
    return warm


def _reference_warm(reference: Scenario, ctx: RunContext, backend: str, count: bool = False) -> _Warm:
    """The trainer of ``reference`` (a scenario's ``reference()``), built and warmed once per run and shared by
    every scenario with that reference, and by the scenarios whose step is the reference's (``_steps_as_reference``);
    its weights move on as it is timed and saved: a step's time and memory do not depend on the weights' values.
    ``count``: the caller reads FLOP counts (``_warm``; the first caller builds it)."""
    return ctx.cached("trainer", reference, lambda: _warm(_build_trainer(reference, ctx, backend), reference, ctx, count))


def _reference_trainer(reference: Scenario, ctx: RunContext, backend: str, count: bool = False) -> Trainer:
    return _reference_warm(reference, ctx, backend, count).trainer


def _steps_as_reference(scenario: Scenario, ctx: RunContext) -> bool:
    """Whether ``scenario`` trains its reference's step (no activation strategy, the same model and workload; its
    save is not part of the step): it then trains on the run's shared reference trainer rather than a second copy
    built and warmed up for it (the checkpoint suite's nine save strategies train one trainer). Not while a run
    injects a slowdown: that wraps the scenario's own step, which must not slow its reference."""
    return scenario.is_reference and ctx.inject is None and scenario.world_size == 1 and not scenario.compile.enabled


def _warmup(trainer: Trainer, steps: int, counting: AbstractContextManager | None = None) -> set[str]:
    """Untimed steps (AdamW state exists afterwards); returns the op names of the first one. ``counting`` (an
    ``activation.flops.StepCount``) is held around the first step's forward and backward."""
    with OpNameRecorder() as recorder:
        trainer.train_step(counting)
    for _ in range(steps - 1):
        trainer.train_step()
    return recorder.op_names


def _peak(trainer: Trainer, probe_name: str, device: torch.device) -> Measurements:
    reading = peak_pass(trainer.train_step, trainer.state_tensors(), probe_name, device)
    out = Measurements()
    out.record("peak_bytes", reading.peak_bytes)
    out.record("state_bytes", reading.start_bytes)
    out.record_all(reading.extra)  # the probe's own (rng_state_bytes, nvml_context_bytes, ...): vocabulary rows too
    return out


def _analytic(scenario: Scenario, trainer: Trainer, device: torch.device) -> Measurements:
    """The analytic model's peak and saving for this scenario, to read each measured number against."""
    from pytest_flashckpt.activation import analytic

    out = Measurements()
    if scenario.model.hf is not None:  # the analytic formulas are the project's families': none for a HF model ("—")
        return out
    config = trainer.model.config
    if not analytic.supports(config):  # no analytic model of this family's blocks: the report shows "—"
        return out
    work = analytic.Workload(
        scenario.batch_size, scenario.seq_len, trainer.model.backend, DTYPES[scenario.dtype].itemsize, device.type
    )
    strategy, k = scenario.activation.strategy, scenario.activation.k
    if strategy == "budget":  # per-shape plans have no closed form; the plan's predicted peak is in the notes
        return out
    if scenario.precision == "mixed":  # the analytic model knows one dtype for states and activations
        return out
    if scenario.step_impl.with_card_norm() != StepImpl():  # the analytic model is AdamW's step with the plain loss
        return out
    own = analytic.estimate(config, work, strategy, k)  # once: analytic.saving would estimate it again
    out.record("analytic_peak_bytes", own.peak_bytes)
    if strategy != "none":  # analytic.saving's ratio, on the estimate above
        out.record("analytic_memory_saving", 1 - own.peak_bytes / analytic.estimate(config, work, "none").peak_bytes)
    return out


@dataclass(frozen=True)
class _Reference:
    """A scenario's reference (``Scenario.reference()``, computed once per scenario) and its shared trainer."""

    scenario: Scenario
    trainer: Trainer


def _measure(scenario: Scenario, ctx: RunContext, result: Result) -> None:
    """The passes the scenario's ``measure`` names, in order, each against the one reference."""
    result.backend = resolve_backend(scenario.attention, ctx.device, DTYPES[scenario.dtype])
    if scenario.attention == "auto":  # the kernel it resolved to trains the same step: one cache entry for both
        scenario = dataclasses.replace(scenario, attention=result.backend)
    if scenario.compile.enabled:
        _measure_compiled(scenario, ctx, result)
        return
    ref_scenario = scenario.reference()
    trainer = _prepared_trainer(scenario, ref_scenario, ctx, result)
    reference = None if scenario.is_reference else _Reference(
        ref_scenario, _reference_trainer(ref_scenario, ctx, result.backend, count=_counts_flops(scenario)))
    shared = _shared_in_run(scenario, ctx, result)
    if "memory" in scenario.measure:
        _memory_pass(scenario, ctx, result, trainer, reference, shared)
    if "timing" in scenario.measure:
        timing = shared(f"timing pass ({scenario.rounds} rounds)", lambda: timing_pass(
            trainer.train_step, None if reference is None else reference.trainer.train_step, scenario.rounds,
            scenario.steps, ctx.device, on_round=lambda i, n: ctx.phase(f"timing round {i}/{n}"),
            more_rounds=confirmation(ctx, result)))
        result.absorb(timing.measurements())
        note_confirmation(result, scenario.rounds, timing)
    if _counts_flops(scenario):  # timed steps get their throughput too
        _flops_and_throughput(scenario, ctx, result, trainer, reference)
    if "checkpoint" in scenario.measure:
        _checkpoint_pass(scenario, ref_scenario, ctx, trainer, result, reference, shared)


def _measure_compiled(scenario: Scenario, ctx: RunContext, result: Result) -> None:
    """A compiled scenario (``runner.compiled``: memory from the allocator's events, timing against the reference
    compiled the same way). The kernel and the FLOPs are read from eager twins (same model and strategy, never
    compiled): both passes run under a dispatch mode, which would make a compiled model run eager. Their FLOPs are
    the eager plan's; ``compile_budget``'s recomputation is its partitioner's, not counted (``—``)."""
    check_can_compile(ctx)  # before anything is built
    backend = result.backend or "sdpa"
    plans: dict = {}  # the compiled budget plan the measured model runs, for its simulation

    def build(which: Scenario, notes: Result | None = None) -> Trainer:
        trainer = _build_trainer(which, ctx, backend)
        plan = _apply_activation(trainer, which, notes or Result(which.suite, which.name, "measured", which))
        if notes is result and plan is not None:
            plans["measured"] = plan
        return trainer

    twin = build(scenario)
    with OpNameRecorder() as recorder:
        twin.train_step()
    result.kernel = detect_kernel(recorder.op_names, backend)
    measure_compiled(scenario, ctx, result, lambda which: build(which, result if which is scenario else None))
    if _counts_flops(scenario) and scenario.activation.strategy != "compile_budget":
        reference = None if scenario.is_reference else _Reference(scenario.reference(), build(scenario.reference()))
        _flops_and_throughput(scenario, ctx, result, twin, reference)
    elif scenario.activation.strategy == "compile_budget":
        result.notes.append("compile_budget: FLOPs and throughput not counted (the partitioner's recomputation is not an eager plan)")
    if "memory" in scenario.measure and result.metrics.get("peak_bytes") is not None:
        plan = plans.get("measured")
        _simulate_compiled(scenario, ctx, result, None if plan is None else plan.policies)


def _simulate_compiled(scenario: Scenario, ctx: RunContext, result: Result, policies: tuple | None = None) -> None:
    """The compiled-step simulator (``simulate.compiled``: torch's own Dynamo, partitioner and Inductor plan, on fake
    tensors) beside the measured allocator peak of the same row: ``compiled_simulated_peak_bytes`` (the simulated
    training state plus the step's simulated peak over it), or a note saying why this row is not simulated
    (``report.compiled.NOT_SIMULATED``), which the report shows in the row."""
    from pytest_flashckpt.simulate.compiled import simulate_compiled_step, unsupported_reason
    from pytest_flashckpt.simulate.scenario import simulated_card

    reason = unsupported_reason(scenario, ctx.device.type)
    if reason is not None:
        result.notes.append(NOT_SIMULATED + reason)
        return
    ctx.phase("compiled-step simulation (fake tensors)")
    activation = scenario.activation
    if scenario.model.hf is not None:  # its config's card: the builder the measured row used (models.hf.card)
        card = simulated_card(scenario)
    else:
        card = card_with_norm(ctx.cards.card(scenario.card, scenario.model.dropout), scenario.step_impl.norm)
    sim = simulate_compiled_step(card, scenario.batch_size, scenario.seq_len, activation.strategy,
                                 scenario.compile.scope, scenario.dtype, seed=scenario.seed, k=activation.k,
                                 budget=activation.budget if activation.strategy == "compile_budget" else None,  # type: ignore[arg-type]
                                 policies=policies, ac_wrapper=scenario.compile.ac_wrapper)
    result.record("compiled_simulated_peak_bytes", sim["state_bytes"] + sim["peak_bytes"])
    result.record("compiled_simulate_seconds", sim["seconds"])


def _prepared_trainer(scenario: Scenario, ref_scenario: Scenario, ctx: RunContext, result: Result) -> Trainer:
    """The scenario's trainer built, its activation strategy applied, warmed up (and slowed on purpose when the
    run injects a regression), or its reference's (``ref_scenario``) when it trains that step; the kernel that ran
    is recorded."""
    ctx.phase("build and warm-up")
    backend = result.backend or "sdpa"
    if _steps_as_reference(scenario, ctx):
        warm = _reference_warm(ref_scenario, ctx, backend, count=_counts_flops(scenario))
        result.kernel = detect_kernel(warm.op_names, backend)
        return warm.trainer

    def build() -> _Warm:
        trainer = _build_trainer(scenario, ctx, backend)
        noted = Result(scenario.suite, scenario.name, "measured", scenario)  # what the strategy notes, kept with it
        _apply_activation(trainer, scenario, noted)
        return _warm(trainer, scenario, ctx, _counts_flops(scenario), tuple(noted.notes))

    # one trainer per run for every scenario that trains the same step (``CacheKey``: the article's rows and their
    # activation-suite twins differ only in their save), as the reference's is shared (``_reference_warm``): a step's
    # time and memory do not depend on how far its weights have moved. An injection slows this scenario's own step:
    # its trainer is never shared.
    warm = build() if ctx.inject is not None else ctx.cached("trainer", scenario, build)
    result.notes.extend(warm.notes)
    if ctx.inject is not None:
        warm.trainer.train_step = ctx.inject.slow_step(warm.trainer.train_step)  # type: ignore[method-assign]
        result.notes.append(ctx.inject.describe())
    result.kernel = detect_kernel(warm.op_names, result.backend or "sdpa")
    return warm.trainer


def _shared_in_run(scenario: Scenario, ctx: RunContext, result: Result):
    """``shared(kind, compute, key=scenario)``: the measurement computed once per run for every scenario that trains
    the same step (the article's medium and large rows differ only in their save), cached under ``key``'s entry
    as ``(id of the scenario that measured it, value)``, with a note naming where it was."""
    def shared(kind: str, compute, key: Scenario = scenario, same: str = "same model, activation and workload"):
        first = ctx.cached(kind, key, lambda: (result.id, compute()))
        if first[0] != result.id:
            result.notes.append(f"{kind}: measured once in this run for {first[0]} ({same})")
        return first[1]

    return shared


def _memory_pass(scenario: Scenario, ctx: RunContext, result: Result, trainer: Trainer, reference: _Reference | None,
                 shared) -> None:
    """Peak and state bytes, the saving against the reference's peak, and the analytic model's numbers."""
    ctx.phase("memory pass")
    result.absorb(shared("memory pass", lambda: _peak(trainer, ctx.probe, ctx.device)))
    if reference is not None:
        ref = ctx.cached("memory pass", reference.scenario,  # the kind (and value) a reference scenario's own pass has
                         lambda: (f"{reference.scenario.suite}::{reference.scenario.name}",
                                 _peak(reference.trainer, ctx.probe, ctx.device)))[1]
        result.record("reference_peak_bytes", ref["peak_bytes"])
        result.record("memory_saving", 1.0 - result.metrics["peak_bytes"] / ref["peak_bytes"])  # type: ignore[operator]
    result.absorb(_analytic(scenario, trainer, ctx.device))


def _flops_and_throughput(scenario: Scenario, ctx: RunContext, result: Result, trainer: Trainer,
                          reference: _Reference | None) -> None:
    """The step's matmul FLOPs (and the reference's, once per run), and for a timed step its throughput."""
    from pytest_flashckpt.activation.flops import count_step

    ctx.phase("FLOP count")
    own = ctx.cached("flop count", scenario, lambda: count_step(trainer))  # a reference scenario's is its reference's
    ref = None if reference is None else ctx.cached("flop count", reference.scenario, lambda: count_step(reference.trainer))
    if "flops" in scenario.measure:
        result.record("step_flops", own.matmul_flops)
        if ref is not None:
            result.record("reference_step_flops", ref.matmul_flops)
            result.record("flop_ratio", own.matmul_flops / ref.matmul_flops)
    if "timing" in scenario.measure:
        ctx.phase("matmul roofline")
        metrics = result.metrics
        throughput = _throughput(scenario, ctx, metrics["step_time_s"], metrics.get("reference_step_time_s"), own, ref)  # type: ignore[arg-type]
        for name, value in throughput.items():
            result.record(name, value)


def _throughput(scenario: Scenario, ctx: RunContext, step_time_s: float, reference_step_time_s: float | None, own, ref) -> dict[str, Any]:
    """Tokens/s, model and hardware FLOP/s, MFU and HFU against the datasheet peak (or why there is none) and the
    measured matmul roofline at this step's GEMM shapes (once per run per dtype and shapes): ``throughput.mfu``."""
    from pytest_flashckpt.throughput import peaks, roofline
    from pytest_flashckpt.throughput.mfu import throughput_metrics

    device = ctx.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = peaks.lookup(device.type, name, peaks.precision_for(scenario.dtype, torch.get_float32_matmul_precision()))
    # the model's matmuls, the reference's (no recompute): every strategy of a workload shares one roofline
    shapes = roofline.roofline_shapes((ref or own).gemm_shapes)
    measured = roofline.cached(ctx.cache, device, DTYPES[scenario.dtype], shapes) if shapes else None
    model_flops = (ref or own).matmul_flops  # the reference's step: no recompute (a reference is its own)
    return throughput_metrics(scenario.batch_size * scenario.seq_len, step_time_s, model_flops, own.matmul_flops,
                              peak, measured, reference_step_time_s)


def _machine_limits(ctx: RunContext, folder: Path, device: torch.device) -> tuple[float, float]:
    """The disk's raw write and the memory copy bandwidth (``checkpoint.measure.machine_limits``), measured once
    per run and device: every checkpoint pass of a run saves under the same work folder, so one reading serves
    them all (each pass measured them itself before: ~1 s of writing 64 MB per pass on a slow disk). Both are
    ``info`` metrics, never gated."""
    from pytest_flashckpt.checkpoint.measure import machine_limits

    key = f"machine limits {device}"
    if key not in ctx.cache:
        ctx.cache[key] = machine_limits(folder, device)
    return ctx.cache[key]


def _saves_as_reference(scenario: Scenario, ref_scenario: Scenario, ctx: RunContext) -> bool:
    """Whether ``scenario``'s checkpoint pass is its reference's (``ref_scenario``: the plain sync save of the same
    step and settings), so one pass serves both: it trains the reference trainer (``_steps_as_reference``, never
    under an injected slowdown or stall) and saves with the reference save's settings."""
    return (_steps_as_reference(scenario, ctx) and scenario.save.strategy != "none"
            and scenario.save == ref_scenario.save)


def _checkpoint_pass(scenario: Scenario, ref_scenario: Scenario, ctx: RunContext, trainer: Trainer, result: Result,
                     reference: _Reference | None, shared) -> None:
    from pytest_flashckpt.checkpoint import run_checkpoint_pass

    with work_folder(ctx.workdir, "ckpt") as root:  # locked while it lives: a killed run's is removed by the next run
        peak = result.metrics.get("peak_bytes") if scenario.save.mem_basis == "peak" else None
        stall = ctx.inject.stall if ctx.inject is not None else 0.0
        limits = _machine_limits(ctx, root, next(trainer.model.parameters()).device)

        def own_pass() -> Measurements:
            return run_checkpoint_pass(trainer, scenario.save, root / "strategy", ctx.probe, peak_bytes=peak,
                                       stall_increase=stall, on_phase=ctx.phase, limits=limits)

        if _saves_as_reference(scenario, ref_scenario, ctx):  # the reference save pass of its workload: measured once
            measured = shared("checkpoint", own_pass, key=ref_scenario, same="the same plain sync save of the same step")
        else:
            measured = own_pass()
        result.absorb(measured)
        from pytest_flashckpt.checkpoint.bandwidth import against_limits

        for name, value in against_limits(measured).items():  # the staging copy against the measured memory copy
            result.record(name, value)
        if scenario.save.strategy != "sync":
            def reference_save() -> Measurements:
                ref_trainer = reference.trainer if reference is not None else _reference_trainer(ref_scenario, ctx, result.backend or "sdpa")
                ctx.phase("reference save (sync)")
                return run_checkpoint_pass(ref_trainer, ref_scenario.save, root / "reference", ctx.probe,
                                           on_phase=lambda text: ctx.phase(f"reference {text}"), limits=limits)

            ref = ctx.cached("checkpoint", ref_scenario,  # (who measured it, its measurements), as ``shared`` keeps it
                             lambda: (f"{ref_scenario.suite}::{ref_scenario.name}", reference_save()))[1]
            metrics = result.metrics
            result.record("reference_save_total_s", ref["save_total_s"])
            result.record("reference_save_stall_s", ref["save_stall_s"])
            result.record("reference_bytes_written", ref["bytes_written"])
            if ref["bytes_written"]:
                result.record("bytes_vs_full", metrics["bytes_written"] / ref["bytes_written"])  # type: ignore[operator]
            stalls, totals = measured.samples["save_stall_s"], ref.samples["save_total_s"]
            # save i's stall over the reference's save i: each sample carries both sides' noise, so the rank test
            # sees it (one shared denominator would shift every sample of a run together, a false alarm waiting)
            ratios = [s / totals[i % len(totals)] for i, s in enumerate(stalls)]
            result.record("stall_vs_sync", statistics.median(ratios), samples=ratios)
            if ref.get("time_lost_s") and "time_lost_s" in metrics:  # measured unless time_lost_rounds: 0
                result.record("reference_time_lost_s", ref["time_lost_s"])
                result.record("time_lost_vs_sync", metrics["time_lost_s"] / ref["time_lost_s"])  # type: ignore[operator]
