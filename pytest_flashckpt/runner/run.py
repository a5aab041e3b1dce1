"""Run one scenario end to end: build -> apply strategies -> memory pass -> timing pass -> FLOPs -> checkpoint
pass -> ``Result``. Nothing here imports pytest: the plugin and the ``flashckpt`` fixture are thin layers on top.

Every ratio is against the scenario's *reference* (same model, kernel, batch and sequence; no activation
checkpointing; a plain synchronous save) measured in the same run. Deterministic reference measurements (peak
memory, the reference save) are cached per run, keyed by the reference's configuration.
"""

from __future__ import annotations

import dataclasses
import shutil
import statistics
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch

from pytest_flashckpt.config.scenario import Scenario
from pytest_flashckpt.config.typed import to_plain
from pytest_flashckpt.models.attention import BackendUnavailable, OpNameRecorder, detect_kernel, resolve_backend
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.probes import make_probe
from pytest_flashckpt.result import Result
from pytest_flashckpt.runner.inject import Injection
from pytest_flashckpt.runner.timing import interleaved, summarise_ratio
from pytest_flashckpt.training import Trainer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class SkipScenario(Exception):
    """This hardware cannot run the scenario; the message is the reason shown in reports and pytest."""


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` -> the first CUDA device when there is one, else the CPU; a missing CUDA is a clear error."""
    if name == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SkipScenario(f"device {name!r} asked for, but torch {torch.__version__} sees no CUDA device")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {name!r}; valid: auto, cpu, cuda, cuda:N")
    return device


@dataclasses.dataclass
class RunContext:
    """Per-run settings and caches shared by the scenarios of one suite run."""

    device: torch.device
    probe: str
    workdir: Path | None = None
    cache: dict[str, Any] = dataclasses.field(default_factory=dict)
    inject: Injection | None = None  # a known regression on purpose (checking the gate; runner/inject.py)

    def cached(self, kind: str, scenario: Scenario, compute):
        key = f"{kind}:{scenario_key(scenario)}"
        if key not in self.cache:
            self.cache[key] = compute()
        return self.cache[key]


def scenario_key(scenario: Scenario) -> str:
    plain = to_plain(scenario)
    for field in ("name", "suite", "description", "article", "measure", "rounds"):
        plain.pop(field, None)
    return repr(sorted(plain.items()))


def run_scenario(scenario: Scenario, ctx: RunContext) -> Result:
    """Measure one scenario; a scenario this hardware cannot run comes back ``skipped`` with the reason, one
    that broke comes back ``error`` with the exception (its traceback in ``notes``), so a run's record is whole."""
    result = Result(scenario.suite, scenario.name, "measured", to_plain(scenario), device=str(ctx.device), probe=ctx.probe)
    try:
        _measure(scenario, ctx, result)
    except SkipScenario as exc:
        result.status, result.reason = "skipped", str(exc)
    except BackendUnavailable as exc:
        result.status, result.reason = "skipped", str(exc)
    except Exception as exc:  # recorded (the report shows the row), then the plugin fails the item with it
        result.status, result.reason = "error", f"{type(exc).__name__}: {exc}"
        result.notes.append("".join(traceback.format_exception(exc)))
    return result


def _build_trainer(scenario: Scenario, ctx: RunContext, backend: str) -> Trainer:
    overrides = {} if scenario.model.dropout is None else {"dropout": scenario.model.dropout}
    card = load_card(scenario.card, **overrides)  # seq_len vs block_size: preflight() and GPT.forward check it
    if ctx.device.type == "cpu" and not card.allocate_on_cpu:
        raise SkipScenario(
            f"model card {card.name!r} ({card.num_params() / 1e9:.1f}B parameters) is only built on the meta device "
            "on a CPU; run it on a GPU"
        )
    model = build_model(card, backend, ctx.device, DTYPES[scenario.dtype], seed=scenario.seed)
    return Trainer.create(model, scenario.batch_size, scenario.seq_len, seed=scenario.seed)


def _apply_activation(trainer: Trainer, scenario: Scenario, result: Result) -> None:
    if scenario.activation.strategy == "none":
        return
    from pytest_flashckpt.activation import StrategyUnavailable, apply_ac

    try:
        applied = apply_ac(trainer.model, scenario.activation)
    except StrategyUnavailable as exc:
        raise SkipScenario(str(exc)) from None
    result.notes.append(f"activation: {applied.describe()}")


def _reference_trainer(scenario: Scenario, ctx: RunContext, backend: str) -> Trainer:
    """The reference's trainer, built and warmed once per run and shared by every scenario with that reference
    (its weights move on as it is timed; a step's time and memory do not depend on the weights' values)."""
    reference = scenario.reference()

    def build() -> Trainer:
        trainer = _build_trainer(reference, ctx, backend)
        _warmup(trainer, max(reference.warmup, 1))
        return trainer

    return ctx.cached("trainer", reference, build)


def _warmup(trainer: Trainer, steps: int) -> set[str]:
    """Untimed steps (AdamW state exists afterwards); returns the op names of the first one."""
    with OpNameRecorder() as recorder:
        trainer.train_step()
    for _ in range(steps - 1):
        trainer.train_step()
    return recorder.op_names


def _peak(trainer: Trainer, probe_name: str, device: torch.device) -> dict[str, int]:
    probe = make_probe(probe_name, device)
    with probe.track(resident=trainer.state_tensors()) as reading:
        trainer.train_step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {"peak_bytes": reading.peak_bytes, "state_bytes": reading.start_bytes, **reading.extra}


def _analytic(scenario: Scenario, trainer: Trainer, device: torch.device) -> dict[str, float | int]:
    """The analytic model's peak and saving for this scenario, to read each measured number against."""
    from pytest_flashckpt.activation import analytic

    config = trainer.model.config
    work = analytic.Workload(
        scenario.batch_size, scenario.seq_len, trainer.model.backend, DTYPES[scenario.dtype].itemsize, device.type
    )
    strategy, k = scenario.activation.strategy, scenario.activation.k
    out: dict[str, float | int] = {"analytic_peak_bytes": analytic.estimate(config, work, strategy, k).peak_bytes}
    if strategy != "none":
        out["analytic_memory_saving"] = analytic.saving(config, work, strategy, k)
    return out


def _measure(scenario: Scenario, ctx: RunContext, result: Result) -> None:
    dtype = DTYPES[scenario.dtype]
    backend = resolve_backend(scenario.attention, ctx.device, dtype)
    result.backend = backend
    trainer = _build_trainer(scenario, ctx, backend)
    _apply_activation(trainer, scenario, result)
    op_names = _warmup(trainer, max(scenario.warmup, 1))
    if ctx.inject is not None:
        trainer.train_step = ctx.inject.slow_step(trainer.train_step)  # type: ignore[method-assign]
        result.notes.append(ctx.inject.describe())
    result.kernel = detect_kernel(op_names, backend)
    reference = None if scenario.is_reference else _reference_trainer(scenario, ctx, backend)
    metrics, samples = result.metrics, result.samples

    if "memory" in scenario.measure:
        metrics.update(_peak(trainer, ctx.probe, ctx.device))
        if reference is not None:
            ref = ctx.cached("memory", scenario.reference(), lambda: _peak(reference, ctx.probe, ctx.device))
            metrics["reference_peak_bytes"] = ref["peak_bytes"]
            metrics["memory_saving"] = 1.0 - metrics["peak_bytes"] / ref["peak_bytes"]

    if "memory" in scenario.measure:
        metrics.update(_analytic(scenario, trainer, ctx.device))

    if "timing" in scenario.measure:
        variants = [trainer.train_step] if reference is None else [reference.train_step, trainer.train_step]
        times = interleaved(variants, scenario.rounds, scenario.steps, ctx.device)
        samples["step_time_s"] = times[-1]
        metrics["step_time_s"] = sorted(times[-1])[len(times[-1]) // 2]
        if reference is not None:
            samples["reference_step_time_s"] = times[0]
            samples["overhead"] = [s / r for s, r in zip(times[1], times[0])]
            summary = summarise_ratio(times[1], times[0])
            metrics["reference_step_time_s"] = sorted(times[0])[len(times[0]) // 2]
            metrics["overhead"] = summary["median"]
            metrics["overhead_min"] = summary["min"]
            metrics["overhead_max"] = summary["max"]

    if "flops" in scenario.measure:
        from pytest_flashckpt.activation.flops import count_step_flops

        metrics["step_flops"] = count_step_flops(trainer)
        if reference is not None:
            ref_flops = ctx.cached("flops", scenario.reference(), lambda: count_step_flops(reference))
            metrics["reference_step_flops"] = ref_flops
            metrics["flop_ratio"] = metrics["step_flops"] / ref_flops

    if "checkpoint" in scenario.measure:
        _checkpoint_pass(scenario, ctx, trainer, result)


def _checkpoint_pass(scenario: Scenario, ctx: RunContext, trainer: Trainer, result: Result) -> None:
    from pytest_flashckpt.checkpoint import run_checkpoint_pass

    root = Path(tempfile.mkdtemp(prefix="flashckpt-", dir=ctx.workdir))
    try:
        peak = result.metrics.get("peak_bytes") if scenario.checkpoint.mem_basis == "peak" else None
        stall = ctx.inject.stall if ctx.inject is not None else 0.0
        measured = run_checkpoint_pass(trainer, scenario.checkpoint, root / "strategy", ctx.probe, peak_bytes=peak, stall_increase=stall)
        for key, value in measured.items():
            if isinstance(value, list):
                result.samples[key] = value
            else:
                result.metrics[key] = value
        if scenario.checkpoint.strategy != "sync":
            ref_scenario = scenario.reference()

            def reference_save() -> dict[str, Any]:
                ref_trainer = _reference_trainer(scenario, ctx, result.backend or "sdpa")
                return run_checkpoint_pass(ref_trainer, ref_scenario.checkpoint, root / "reference", ctx.probe)

            ref = ctx.cached("checkpoint", ref_scenario, reference_save)
            metrics = result.metrics
            metrics["reference_save_total_s"] = ref["save_total_s"]
            metrics["reference_save_stall_s"] = ref["save_stall_s"]
            metrics["reference_bytes_written"] = ref["bytes_written"]
            if ref["bytes_written"]:
                metrics["bytes_vs_full"] = metrics["bytes_written"] / ref["bytes_written"]
            stalls, totals = result.samples["save_stall_s_samples"], ref["save_total_s_samples"]
            # save i's stall over the reference's save i: each sample carries both sides' noise, so the rank test
            # sees it (one shared denominator would shift every sample of a run together, a false alarm waiting)
            ratios = [s / totals[i % len(totals)] for i, s in enumerate(stalls)]
            result.samples["stall_vs_sync"] = ratios
            metrics["stall_vs_sync"] = statistics.median(ratios)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def preflight(scenario: Scenario) -> None:
    """Static checks before anything runs (model card readable, sequence fits, strategy fits the model);
    raises ConfigError naming the scenario and the fix."""
    from pytest_flashckpt.config.errors import ConfigError

    where = f"{scenario.suite}::{scenario.name}"
    card = load_card(scenario.card)
    if scenario.seq_len > card.block_size:
        raise ConfigError(where, f"seq_len {scenario.seq_len} exceeds block_size {card.block_size} of model card {card.name!r}", "use a shorter seq_len or a card with more positions")
    if scenario.activation.strategy == "every_k" and scenario.activation.k > card.n_layer:
        raise ConfigError(where, f"activation.k {scenario.activation.k} is larger than the {card.n_layer} blocks of {card.name!r}", f"valid: 1..{card.n_layer}")
