"""The metric vocabulary: every metric a run records, defined once.

A metric has a name (the key in ``Result.metrics`` and ``results.json``), a unit, a kind (how a baseline judges
it), which direction is worse, whether the regression gate guards it, the ``@pytest.mark.flashckpt`` budget key
that bounds it (if any) and the formatter the report uses. The runner, the fixture, the baseline verdicts, the
report, ``flashckpt compare`` and the budgets read this table instead of keeping their own lists, so adding a
metric is: a row here plus the code that produces it (docs/architecture.md, "How to add ... A metric").

The vocabulary has two tables: ``NUMBERS``, the measured quantities (the gated ones among them), and ``LABELS``,
the texts a run records beside them (which ``strategy`` ran, the checkpoint ``format``, the ``budget_plan``, the
datasheet ``peak_source``): reported as written, never gated, compared or formatted as a number. ``METRICS`` is
both. The lists other modules show by default are attributes of a number's row, not lists of their own:
``compare_order`` (``COMPARED``, what ``flashckpt compare`` shows), ``history_order`` (``FOLLOWED``, what
``flashckpt history`` follows) and ``per_save`` (``PER_SAVE``, the medians over a checkpoint pass's saves).

A measurement is written through ``Measurements.record(metric, value, samples=(), per_rank=())`` (a pass's
measurements) or ``Result.record`` (the same call on a scenario's result): a name outside this table is refused
there, at the producer, with the valid names. Samples (per round, per save) and per-rank values are kept under the
metric's own name.

Kinds:

- ``exact``: a deterministic count (FLOPs, files, bytes written): compared exactly (``slack``: relative slack);
- ``memory``: bytes read by a memory probe: exact under an exact probe (``cpu``), with the memory tolerance under
  a sampled or allocator probe (``cuda``, ``nvml``, ``rss``);
- ``sampled``: bytes that vary run to run with any probe (an async save frees staging buffers from a thread):
  always with the memory tolerance;
- ``ratio``: a timing ratio to the reference measured side by side: tolerance plus a significance test;
- ``time``: absolute seconds: recorded, gated only when asked (``--flashckpt-gate-times``);
- ``info``: recorded and reported, never gated.

This module imports only ``core.numbers`` from the project (and no torch): every layer may read it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Literal

from pytest_flashckpt.core import numbers

Kind = Literal["exact", "memory", "sampled", "ratio", "time", "info"]
Worse = Literal["higher", "lower"]


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str  # "B", "s", "ratio", "fraction", "FLOP", "FLOP/s", "tokens/s", "count", "MB/s", "GB/s", "text"
    kind: Kind
    description: str
    worse: Worse = "higher"
    gated: bool = False  # kept in baselines and judged by the regression gate
    budget: str | None = None  # the @pytest.mark.flashckpt key bounding it
    slack: float = 0.0  # exact kind: relative difference still counted as equal
    fmt: str = "number"  # a formatter name in pytest_flashckpt.core.numbers.FORMATTERS
    needs: str = ""  # what the fixture's measure() must be given for it to exist ("reference=", "save=")
    # its level differs between hosts of one profile with nothing changed (baselines/README.md, "Across hosts"):
    # against a baseline of one host's runs it is gated only at Thresholds.host_tolerance, `unstable` below it
    host_sensitive: bool = False
    # how far this ratio's run median moves between runs of unchanged code on one quiet host, where that is more than
    # the timing tolerance: the gate judges it against a baseline with at least this tolerance and lets its baseline
    # runs spread this much before it is `unstable` (measured: reports/run-drift.md for stall_vs_copy,
    # reports/run-drift-overhead.md for overhead; 0 = the thresholds' own)
    run_drift: float = 0.0
    per_save: bool = False  # a checkpoint pass records the median over its saves, every save's value the samples
    compare_order: int = 0  # its place in what `flashckpt compare` shows by default (1 first; 0: only with --metric)
    history_order: int = 0  # its place in what `flashckpt history` follows by default (1 first; 0: only with --metric)

    def __post_init__(self) -> None:
        if (self.unit == "text") != isinstance(self, Label):
            raise TypeError(f"metric {self.name!r}: a text is a Label row, a number a Metric row (unit {self.unit!r})")

    @property
    def whole(self) -> bool:
        """Counted in whole units (bytes, files, FLOPs): a median of its samples is rounded down to an integer."""
        return self.unit in ("B", "count", "FLOP")

    @property
    def fraction(self) -> bool:
        """Shown as %, and a change of it in percentage points."""
        return self.unit == "fraction"

    @property
    def has_samples(self) -> bool:
        """Judged on per-round samples (stored in baselines beside the median)."""
        return self.kind in ("ratio", "time")


@dataclass(frozen=True)
class Label(Metric):
    """A text a run records beside its numbers (which strategy ran, a plan, where a datasheet peak comes from):
    reported as written; never gated, bounded by a budget or compared."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gated or self.budget or self.compare_order or self.history_order or self.per_save:
            raise TypeError(f"label {self.name!r} is text: it cannot be gated, budgeted, compared or followed")


def _label(name: str, description: str) -> Label:
    return Label(name, "text", "info", description)


_NUMBERS = (
    # gated metrics first, in the order verdict rows list them
    Metric("peak_bytes", "B", "memory", "most memory alive at once during one training step", gated=True, budget="max_peak_memory", fmt="mib", compare_order=1, history_order=3),
    Metric("state_bytes", "B", "memory", "memory alive across steps (weights, optimizer state, batch)", gated=True, fmt="mib"),
    Metric("save_extra_peak_bytes", "B", "sampled", "memory a save adds on top of training (staging buffers, transient peak)", gated=True, fmt="mib", compare_order=10, per_save=True),
    Metric("step_flops", "FLOP", "exact", "floating-point operations of one training step", gated=True, fmt="gflop"),
    # container metadata (zip entries, pickled names, DCP .metadata) may vary by a few hundred bytes: 1e-4 of the
    # tiny model's ~150 MB checkpoint is ~15 KB, far below a dropped or duplicated tensor (>= 1 MB there)
    Metric("bytes_written", "B", "exact", "bytes one save writes", gated=True, slack=1e-4, per_save=True),
    Metric("files", "count", "exact", "files one save writes", gated=True, fmt="count", per_save=True),
    Metric("overhead", "ratio", "ratio", "median per-round step time / reference step time", gated=True, budget="max_overhead", fmt="ratio", needs="reference=", run_drift=0.10, compare_order=4, history_order=1),
    Metric("stall_vs_copy", "ratio", "ratio", "median per-save stall of a staged save / a blocking copy of the same state timed just before it (saves 2..n; the gated stall)", gated=True, fmt="ratio", host_sensitive=True, run_drift=0.15, history_order=2),
    Metric("stall_vs_sync", "fraction", "info", "median per-save stall / the reference's synchronous save time (save i over the reference's save i; the article's async criterion)", fmt="pct"),
    Metric("save_stall_s", "s", "time", "how long a save blocks the training loop", gated=True, budget="max_save_stall", fmt="ms", needs="save=", compare_order=6, history_order=5, per_save=True),
    Metric("step_time_s", "s", "time", "median step time", gated=True, budget="max_step_time", fmt="ms", compare_order=3, history_order=4),
    Metric("save_total_s", "s", "time", "until a save is durable and committed", gated=True, fmt="ms", compare_order=7, per_save=True),
    Metric("load_s", "s", "time", "loading and verifying the last checkpoint", gated=True, fmt="ms", compare_order=9),
    # recorded and reported
    Metric("reference_peak_bytes", "B", "info", "the reference's peak_bytes", fmt="mib"),
    Metric("memory_saving", "fraction", "info", "1 - peak / reference peak", worse="lower", budget="min_memory_saving", fmt="pct", needs="reference=", compare_order=2),
    Metric("analytic_peak_bytes", "B", "info", "the analytic model's peak for this scenario", fmt="mib"),
    Metric("analytic_memory_saving", "fraction", "info", "the analytic model's saving", worse="lower", fmt="pct"),
    Metric("reference_step_time_s", "s", "info", "the reference's median step time", fmt="ms"),
    Metric("overhead_min", "ratio", "info", "smallest per-round overhead", fmt="ratio"),
    Metric("overhead_max", "ratio", "info", "largest per-round overhead", fmt="ratio"),
    Metric("confirmation_rounds", "count", "info", "timing rounds added after the first look read slower than the baseline (--flashckpt-confirm-rounds)", fmt="count"),
    Metric("reference_step_flops", "FLOP", "info", "the reference's step_flops", fmt="gflop"),
    Metric("flop_ratio", "ratio", "info", "step_flops / reference step_flops", fmt="ratio", compare_order=5),
    Metric("reference_save_total_s", "s", "info", "the reference's synchronous save time", fmt="ms"),
    Metric("reference_save_stall_s", "s", "info", "the reference's save stall", fmt="ms"),
    Metric("write_MBps", "MB/s", "info", "bytes written / write time", worse="lower", fmt="mbps", compare_order=8, per_save=True),
    Metric("raw_write_MBps", "MB/s", "info", "this disk's raw write bandwidth, measured in the same folder", worse="lower", fmt="mbps"),
    Metric("copy_GBps", "GB/s", "info", "this machine's memory copy bandwidth", worse="lower", fmt="gbps"),
    Metric("write_vs_raw", "fraction", "info", "write_MBps / raw_write_MBps", worse="lower", fmt="pct"),
    Metric("snapshot_bytes", "B", "info", "bytes copied by a save's snapshot", fmt="mib"),
    Metric("first_save_stall_s", "s", "info", "the first staged save's stall (allocates the staging buffers, starts the writer; not in stall_vs_copy)", fmt="ms"),
    Metric("snapshot_copy_s", "s", "info", "a blocking staging copy of the state, timed just before each staged save", fmt="ms"),
    Metric("write_wait_s", "s", "info", "wait_for_write: median seconds the save loop waited, untimed, for the write in flight before a staged save (0: it had finished)", fmt="ms"),
    Metric("copy_bound_s", "s", "info", "snapshot bytes / copy bandwidth: the least a snapshot can take", fmt="ms"),
    Metric("saves", "count", "info", "saves measured", fmt="count"),
    Metric("steps", "count", "info", "training steps of the checkpoint pass", fmt="count"),
    Metric("deferrals", "count", "info", "saves a scheduled strategy deferred", fmt="count"),
    Metric("forced_saves", "count", "info", "deferred saves forced after max_defer_steps", fmt="count"),
    Metric("reference_bytes_written", "B", "info", "bytes the reference's full synchronous save writes", fmt="mib"),
    Metric("bytes_vs_full", "fraction", "info", "bytes_written / the reference's full save bytes (selective saves write less)", fmt="pct"),
    Metric("mem_threshold_bytes", "B", "info", "scheduled, mem_basis peak: the threshold in bytes (mem_threshold x measured peak)", fmt="mib"),
    Metric("max_save_memory_fraction", "fraction", "info", "scheduled, mem_basis peak: the highest memory reading a save was taken at, of the peak", fmt="pct"),
    Metric("cuda_peak_reserved_bytes", "B", "info", "CUDA caching-allocator reserved peak (cuda probe)", fmt="mib"),
    Metric("nvml_peak_used_bytes", "B", "info", "device memory used at its sampled peak (nvml probe)", fmt="mib"),
    Metric("nvml_context_bytes", "B", "info", "device memory outside torch (CUDA context; nvml probe)", fmt="mib"),
    Metric("nvml_context_created_by_probe", "count", "info", "1 when the nvml probe created the CUDA context itself (then reported apart)", fmt="count"),
    Metric("nvml_samples", "count", "info", "device memory readings the nvml probe's sampler took", fmt="count"),
    Metric("rss_samples", "count", "info", "resident-memory readings the rss probe's sampler took", fmt="count"),
    Metric("cuda_other_live_bytes", "B", "info", "device memory alive at the probe's start that is not this scenario's (other objects)", fmt="mib"),
    # checkpoint pass: GPU staging, overlapped copy, time lost per save (checkpoint/time_lost.py)
    Metric("save_staging_host_bytes", "B", "info", "pinned host staging of a GPU save (host memory; not in save_extra_peak_bytes there)", fmt="mib"),
    Metric("fence_wait_s", "s", "info", "how long optimizer.step waited for an overlapped copy (part of save_stall_s)", fmt="ms"),
    # time lost can be near zero or negative (an overlapped save), so it is judged as an absolute time (gated with
    # --flashckpt-gate-times, on its per-round samples), not as a relative ratio
    Metric("time_lost_s", "s", "time", "extra training-loop time one save costs: K steps with a save minus K without", gated=True, fmt="ms"),
    Metric("time_lost_vs_sync", "ratio", "info", "time_lost_s / the reference synchronous save's time_lost_s", fmt="ratio"),
    Metric("reference_time_lost_s", "s", "info", "the reference synchronous save's time_lost_s", fmt="ms"),
    Metric("time_lost_min_s", "s", "info", "smallest per-round time lost", fmt="ms"),
    Metric("time_lost_max_s", "s", "info", "largest per-round time lost", fmt="ms"),
    Metric("time_lost_plain_s", "s", "info", "median time of the K-step window without a save", fmt="ms"),
    Metric("time_lost_saving_s", "s", "info", "median time of the K-step window with a save", fmt="ms"),
    Metric("time_lost_window_steps", "count", "info", "K: steps per time-lost window", fmt="count"),
    # distributed scenarios (pytest_flashckpt/distributed): per-rank values are in Result.per_rank under the metric's name
    Metric("world_size", "count", "info", "ranks of a distributed or simulated-FSDP scenario", fmt="count"),
    Metric("peak_bytes_min_rank", "B", "info", "the smallest rank's peak (peak_bytes is the largest)", fmt="mib"),
    Metric("fwd_bwd_peak_bytes", "B", "memory", "largest rank's peak during forward and backward (FSDP2)", fmt="mib"),
    Metric("optimizer_peak_bytes", "B", "memory", "largest rank's peak during the optimizer step on the shards", fmt="mib"),
    Metric("rng_state_bytes", "B", "info", "bytes of the CPU RNG states torch.utils.checkpoint took during the measured step (alive or not; the live ones are in peak_bytes)", fmt="mib"),
    Metric("largest_allgather_bytes", "B", "info", "largest FSDP2 all-gather a rank made (gloo's uncounted staging: up to 4 of it)", fmt="mib"),
    Metric("async_staged_bytes", "B", "info", "host bytes staged by async sharded saves, all ranks", fmt="mib"),
    Metric("async_rss_added_bytes", "B", "info", "resident memory an async sharded save added, all ranks", fmt="mib"),
    Metric("roundtrip_differences", "count", "info", "tensors that differed after a sharded load (0, or the scenario errors)", fmt="count"),
    Metric("launch_wall_s", "s", "info", "wall time of the torchrun launch of all ranks", fmt="ms"),
    # simulated scenarios (pytest_flashckpt/simulate): deterministic predictions, reported, never gated
    Metric("simulated_peak_bytes", "B", "info", "predicted peak of the step on the meta device", fmt="mib"),
    Metric("simulated_start_bytes", "B", "info", "predicted memory alive at the step's start", fmt="mib"),
    Metric("simulated_parameters_bytes", "B", "info", "predicted peak breakdown: parameters", fmt="mib"),
    Metric("simulated_gradients_bytes", "B", "info", "predicted peak breakdown: gradients", fmt="mib"),
    Metric("simulated_optimizer_state_bytes", "B", "info", "predicted peak breakdown: optimizer state", fmt="mib"),
    Metric("simulated_activations_bytes", "B", "info", "predicted peak breakdown: activations", fmt="mib"),
    Metric("simulated_temporaries_bytes", "B", "info", "predicted peak breakdown: temporaries", fmt="mib"),
    Metric("simulated_reference_peak_bytes", "B", "info", "predicted peak of the reference (no activation checkpointing)", fmt="mib"),
    Metric("simulated_memory_saving", "fraction", "info", "1 - simulated peak / simulated reference peak", worse="lower", fmt="pct"),
    Metric("simulated_kept_bytes", "B", "info", "predicted bytes kept for the backward pass", fmt="mib"),
    Metric("simulated_block_kept_bytes", "B", "info", "predicted bytes one block keeps for the backward pass", fmt="mib"),
    Metric("analytic_block_kept_bytes", "B", "info", "the analytic model's bytes kept per block", fmt="mib"),
    Metric("korthikanti_block_bytes", "B", "info", "the published per-layer formula s*b*h*(34 + 5*a*s/h) (16-bit)", fmt="mib"),
    Metric("simulate_seconds", "s", "info", "wall time of the simulation", fmt="ms"),
    # the budget strategy planned from simulated costs (simulate.costs): the plan and what it predicts
    Metric("budget_bytes", "B", "info", "the budget the plan had to fit (resolved to bytes)", fmt="mib"),
    Metric("budget_predicted_peak_bytes", "B", "info", "the plan's predicted peak", fmt="mib"),
    Metric("budget_min_peak_bytes", "B", "info", "the smallest achievable peak (every block planned for least memory)", fmt="mib"),
    Metric("budget_none_peak_bytes", "B", "info", "the predicted peak without checkpointing", fmt="mib"),
    Metric("budget_recompute_flops", "FLOP", "info", "matmul FLOPs the plan recomputes", fmt="gflop"),
    Metric("budget_plan_seconds", "s", "info", "wall time of planning: costs for the shape plus the solve", fmt="ms"),
    Metric("budget_costs_seconds", "s", "info", "wall time of the plan's costs (simulated steps)", fmt="ms"),
    Metric("budget_compiled_check_peak_bytes", "B", "info", "a compiled plan's step simulated compiled by its check (compile_policy.plan_compiled's compiled_peak): whole-step peak of the plan kept", fmt="mib"),
    Metric("budget_replans", "count", "info", "re-plans the compiled check took (simulated compiled peak over the budget, solved again lower on the front)", fmt="count"),
    # a compiled scenario (runner/compiled.py, docs/compile.md): compile apart from the step, graphs after warm-up
    Metric("compile_time_s", "s", "time", "wall time of the first compiled step: Dynamo tracing and Inductor compiling forward and backward, plus that one step (apart from step_time_s; not gated)", fmt="ms"),
    Metric("reference_compile_time_s", "s", "info", "the compiled reference's compile_time_s", fmt="ms"),
    Metric("recompiles", "count", "info", "graphs Dynamo compiled after the warm-up (memory and timing passes): flagged in the report", fmt="count"),
    Metric("compiled_simulated_peak_bytes", "B", "info", "the same compiled step simulated on fake tensors (simulate.compiled: Inductor's plan, no kernel run): training state plus the step's peak over it, beside the measured peak_bytes", fmt="mib"),
    Metric("compiled_simulate_seconds", "s", "info", "wall time of the compiled-step simulation", fmt="ms"),
    Metric("compiled_regions", "count", "info", "calls of compiled code in the measured step (one per compiled block, or one for the model)", fmt="count"),
    # throughput (pytest_flashckpt/throughput): how close the step is to the machine's limit; reported, never gated
    # (a strategy's MFU over its reference's is 1 / overhead, gated as overhead; absolute rates are time-like)
    Metric("tokens_per_s", "tokens/s", "info", "tokens of one step / median step time", worse="lower", fmt="tokens_rate"),
    Metric("model_step_flops", "FLOP", "info", "useful FLOPs of one step: the reference's (no recompute) counted step", fmt="gflop"),
    Metric("hardware_step_flops", "FLOP", "info", "FLOPs one step executes, recomputation included (the scenario's own count)", fmt="gflop"),
    Metric("model_flops_per_s", "FLOP/s", "info", "model FLOPs / median step time", worse="lower", fmt="flops_rate"),
    Metric("hardware_flops_per_s", "FLOP/s", "info", "hardware FLOPs / median step time", worse="lower", fmt="flops_rate"),
    Metric("mfu", "fraction", "info", "model FLOP/s / the device's dense datasheet peak for the dtype (MFU)", worse="lower", fmt="pct"),
    Metric("hfu", "fraction", "info", "hardware FLOP/s / the device's dense datasheet peak for the dtype (HFU)", worse="lower", fmt="pct"),
    Metric("peak_flops_per_s", "FLOP/s", "info", "the dense datasheet peak MFU is judged against", fmt="flops_rate"),
    Metric("roofline_flops_per_s", "FLOP/s", "info", "measured matmul roofline: best torch.mm FLOP/s at the step's GEMM shapes and dtype", worse="lower", fmt="flops_rate"),
    Metric("mfu_roofline", "fraction", "info", "model FLOP/s / the measured matmul roofline", worse="lower", fmt="pct"),
    Metric("hfu_roofline", "fraction", "info", "hardware FLOP/s / the measured matmul roofline", worse="lower", fmt="pct"),
    Metric("reference_mfu", "fraction", "info", "the reference's MFU over the same interleaved rounds (its HFU is the same)", worse="lower", fmt="pct"),
    Metric("reference_mfu_roofline", "fraction", "info", "the reference's MFU / roofline over the same interleaved rounds", worse="lower", fmt="pct"),
    # checkpoint I/O against its limits (write_vs_raw above): the staging copy against the measured memory copy
    Metric("staging_GBps", "GB/s", "info", "snapshot bytes / the blocking staging copy's time (staged saves)", worse="lower", fmt="gbps"),
    Metric("staging_vs_copy", "fraction", "info", "staging_GBps / copy_GBps: the staging copy against this machine's measured memory copy", worse="lower", fmt="pct"),
)

_LABELS = (
    # the checkpoint pass (checkpoint/measure.py)
    _label("strategy", "the save strategy that ran"),
    _label("format", "the checkpoint file format (torch, safetensors, dcp)"),
    _label("verified", "how the loaded checkpoint was checked against the saved state (bitwise)"),
    _label("staging", "how an async save copies its snapshot (overlapped: during the next step)"),
    # memory probes (pytest_flashckpt/probes)
    _label("nvml_memory_api", "the NVML memory call the nvml probe read (v2: used excludes reserved; v1)"),
    # the budget strategy (simulate.costs)
    _label("budget_plan", "the budget strategy's plan: option per block, predicted peak, solve time"),
    # a compiled scenario (runner/compiled.py)
    _label("peak_memory_source", "where a compiled step's peak_bytes were read (the allocator's events: the cpu probe would run it eager)"),
    # throughput (pytest_flashckpt/throughput)
    _label("peak_source", "the datasheet peak's product, precision and source document"),
    _label("mfu_absent", "why there is no datasheet MFU (a CPU, an unknown device, a precision the datasheet lacks)"),
    _label("roofline_shape", "the GEMM shape (M x K x N, dtype) where the roofline was reached"),
)

NUMBERS: dict[str, Metric] = {m.name: m for m in _NUMBERS}
"""The measured quantities: gated, budgeted, compared, formatted by unit."""
LABELS: dict[str, Label] = {m.name: m for m in _LABELS}
"""The texts recorded beside them (``strategy``, ``format``, ``budget_plan``, ``peak_source``...)."""
assert not set(NUMBERS) & set(LABELS), "a name is both a number and a label"
METRICS: dict[str, Metric] = {**NUMBERS, **LABELS}
"""Every name a run may record: the numbers, then the labels."""


def _in_order(place: str) -> tuple[str, ...]:
    """The numbers with a nonzero ``place`` attribute, by it: a default list read off the vocabulary."""
    ranked = sorted((getattr(m, place), m.name) for m in _NUMBERS if getattr(m, place))
    places = [rank for rank, _ in ranked]
    assert places == list(range(1, len(ranked) + 1)), f"{place}: the places must be 1..n, each once: {ranked}"
    return tuple(name for _, name in ranked)


GATED: tuple[str, ...] = tuple(m.name for m in _NUMBERS if m.gated)
"""A baseline stores exactly these (plus their per-round samples); every one is "higher is worse"."""
assert all(METRICS[n].worse == "higher" for n in GATED), "the gate judges increases as regressions"
SAMPLED: tuple[str, ...] = tuple(m.name for m in _NUMBERS if m.gated and m.has_samples)
BUDGETS: dict[str, Metric] = {m.budget: m for m in _NUMBERS if m.budget}
COMPARED: tuple[str, ...] = _in_order("compare_order")
"""What ``flashckpt compare`` shows by default (``--metric`` picks others)."""
FOLLOWED: tuple[str, ...] = _in_order("history_order")
"""What ``flashckpt history`` follows by default (``--metric`` picks others)."""
PER_SAVE: tuple[str, ...] = tuple(m.name for m in _NUMBERS if m.per_save)
"""The medians over a checkpoint pass's saves (``SaveRecord`` fields), each with every save's value as samples."""


class UnknownMetric(ValueError):
    """A measurement written under a name that is not a row of the vocabulary."""


def spec(name: str) -> Metric:
    """The vocabulary row of ``name``; ``UnknownMetric`` names the key, the closest rows and where to add one."""
    row = METRICS.get(name)
    if row is not None:
        return row
    close = difflib.get_close_matches(name, METRICS, n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise UnknownMetric(
        f"{name!r} is not a metric of the vocabulary{hint}; add a Metric (or Label) row to pytest_flashckpt/core/metrics.py "
        f"or record one of: {', '.join(METRICS)}"
    )


MetricValue = float | int | str | None
"""A metric's value: a number, a text (``strategy``, ``peak_source``), or None (not measurable here)."""


class CheckedValues(dict):
    """A dict whose writes (``[]=``, ``update``, ``setdefault``) accept only vocabulary names (``UnknownMetric``
    otherwise); building one from stored data (``CheckedValues(mapping)``) is not a write and keeps every key, so
    an older file with a since-removed metric still loads."""

    def __setitem__(self, name: str, value: Any) -> None:
        spec(name)
        super().__setitem__(name, value)

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        for name, value in dict(*args, **kwargs).items():
            self[name] = value

    def setdefault(self, name: str, default: Any = None) -> Any:
        if name not in self:
            self[name] = default
        return self[name]

    def __ior__(self, other: Any):  # type: ignore[override]
        self.update(other)
        return self

    def __reduce__(self):  # a copy or a pickle is rebuilt from the stored mapping, as a loaded file is
        return (type(self), (dict(self),))


def record_into(
    values: MutableMapping[str, MetricValue], samples_of: MutableMapping[str, list], per_rank_of: MutableMapping[str, list],
    metric: str, value: MetricValue, samples: Iterable[float] = (), per_rank: Iterable[float] = (),
) -> None:
    """The one write of a measurement (``Measurements.record``, ``Result.record``): ``metric`` must be a vocabulary
    name (``UnknownMetric`` otherwise), a label's value a text, a number's not; its samples and per-rank values are
    kept under its own name when given."""
    row = spec(metric)
    if value is not None and isinstance(value, str) != isinstance(row, Label):
        kind = "a label: its value is a text" if isinstance(row, Label) else "a number: its value cannot be a text"
        raise TypeError(f"metric {metric!r} is {kind}, not {value!r}")
    values[metric] = value
    samples, per_rank = list(samples), list(per_rank)
    if samples:
        samples_of[metric] = samples
    if per_rank:
        per_rank_of[metric] = per_rank


class Measurements(Mapping):
    """Metrics of the vocabulary with their samples, written through ``record``: ``values`` (metric -> value),
    ``samples`` (metric -> per-round or per-save values, the ones its median came from) and ``per_rank``
    (metric -> one value per rank of a distributed scenario). Reads like the mapping of its values
    (``measured["bytes_written"]``, ``"load_s" in measured``)."""

    def __init__(self) -> None:
        self.values: CheckedValues = CheckedValues()
        self.samples: CheckedValues = CheckedValues()
        self.per_rank: CheckedValues = CheckedValues()

    def record(self, metric: str, value: MetricValue, samples: Iterable[float] = (), per_rank: Iterable[float] = ()) -> None:
        """Write ``metric`` (a vocabulary name: ``UnknownMetric`` otherwise) with its value, and the samples and
        per-rank values behind it when there are any."""
        record_into(self.values, self.samples, self.per_rank, metric, value, samples, per_rank)

    def record_all(self, values: Mapping[str, MetricValue]) -> None:
        """``record`` for each of ``values`` (none with samples)."""
        for metric, value in values.items():
            self.record(metric, value)

    def absorb(self, other: "Measurements") -> None:
        """Take every value, sample list and per-rank list of ``other`` (its names are checked already)."""
        self.values.update(other.values)
        self.samples.update(other.samples)
        self.per_rank.update(other.per_rank)

    def __getitem__(self, metric: str) -> MetricValue:
        return self.values[metric]

    def __iter__(self):
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)


def judged_as(name: str, exact_probe: bool) -> Literal["exact", "memory", "ratio", "time"] | None:
    """How the gate judges ``name`` for a result measured with an exact (``True``) or sampled probe; None: not gated."""
    spec = METRICS.get(name)
    if spec is None or not spec.gated:
        return None
    if spec.kind == "memory":
        return "exact" if exact_probe else "memory"
    if spec.kind == "sampled":
        return "memory"
    return spec.kind  # type: ignore[return-value]


def format_metric(name: str, value: object) -> str:
    """A metric's value as a person reads it; names outside the table fall back to their suffix (probe extras)."""
    if value is None or isinstance(value, (str, bool)) or not isinstance(value, (int, float)):
        return numbers.number(value)
    spec = METRICS.get(name)
    if spec is not None:
        return numbers.FORMATTERS[spec.fmt](value)
    if name.endswith("_saving"):
        return numbers.pct(value)
    if name.endswith("_ratio"):
        return numbers.ratio(value)
    for suffix, fmt in (("_bytes", "mib"), ("_s", "ms"), ("_MBps", "mbps"), ("_GBps", "gbps"), ("flops", "gflop")):
        if name.endswith(suffix):
            return numbers.FORMATTERS[fmt](value)
    return numbers.number(value)


def is_fraction(name: str) -> bool:
    spec = METRICS.get(name)
    return spec.fraction if spec is not None else name.endswith("_saving")
