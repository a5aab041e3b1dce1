"""The checkpoint pass of a scenario: train, save ``config.saves`` times, load back, verify, report metrics.

Its work folder comes from the runner (``files.work_folder``: locked while it lives, so a killed run's folder is
removed by the next run).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from pytest_flashckpt.checkpoint.bandwidth import SnapshotCopyTimer, copy_bandwidth_GBps, write_bandwidth_MBps
from pytest_flashckpt.checkpoint.checkpointer import Checkpointer
from pytest_flashckpt.checkpoint.errors import CheckpointError
from pytest_flashckpt.checkpoint.loading import load_into
from pytest_flashckpt.checkpoint.metrics import COUNTED, PER_SAVE_METRICS, SaveRecord, median
from pytest_flashckpt.checkpoint.scheduling import memory_gauge
from pytest_flashckpt.checkpoint.state import capture
from pytest_flashckpt.checkpoint.time_lost import measure_time_lost
from pytest_flashckpt.config.scenario import SaveConfig
from pytest_flashckpt.core.metrics import Measurements
from pytest_flashckpt.probes import make_probe
from pytest_flashckpt.probes.cpu import LiveBytes
from pytest_flashckpt.training import Trainer


def _peak_gauge(trainer: Trainer, peak_bytes: int | None, probe_name: str):
    """(gauge, context of one training step) for ``mem_basis: peak``: live tensor bytes against the measured peak.
    CPU: the exact ``cpu`` probe's count, active during training steps; CUDA: the caching allocator's count."""
    if peak_bytes is None or peak_bytes <= 0:
        raise ValueError("mem_basis: peak needs the scenario's measured peak_bytes (measure: memory)")
    device = next(trainer.model.parameters()).device
    if device.type == "cuda":
        return (lambda: (torch.cuda.memory_allocated(device), peak_bytes)), contextlib.nullcontext
    if probe_name != "cpu":
        raise ValueError(f"mem_basis: peak on a CPU reads live tensor bytes with the exact 'cpu' probe, not {probe_name!r}")
    live = LiveBytes(trainer.state_tensors())
    return (lambda: (live.live_bytes, peak_bytes)), live.counting


def _lengthen_stalls(ckpt: Checkpointer, fraction: float) -> None:
    """Every save blocks the loop ``fraction`` longer than it did (an injected regression, see config/injection.py):
    a real sleep before ``save`` returns, counted in the stall (and in the total of a blocking save)."""
    save = ckpt.save

    def slower(trainer: Trainer):
        record = save(trainer)
        extra = fraction * record.save_stall_s
        time.sleep(extra)
        record.save_stall_s += extra
        if not ckpt.background:
            record.save_total_s += extra
        return record

    ckpt.save = slower  # type: ignore[method-assign]


@dataclass
class _SaveLoop:
    """What the save loop leaves: the checkpointer (closed) with its records, the steps trained and, for staged
    saves, the blocking copy of the same state timed just before each save and (``wait_for_write``) the untimed
    wait for the previous write before it."""

    ckpt: Checkpointer
    steps: int
    copies: list[float]
    waits: list[float]  # wait_for_write: seconds waited for the write in flight before each save

    @property
    def records(self) -> list[SaveRecord]:
        return self.ckpt.records


def run_checkpoint_pass(
    trainer: Trainer, config: SaveConfig, workdir: Path, probe_name: str = "cpu", peak_bytes: int | None = None,
    stall_increase: float = 0.0, on_phase: Callable[[str], None] | None = None,
    limits: tuple[float, float] | None = None,
) -> Measurements:
    """Train ``trainer`` and save it ``config.saves`` times with ``config``'s strategy under ``workdir/checkpoints``,
    then load the newest checkpoint back into ``trainer`` and check it bit for bit against the state it saved.

    Returns ``Measurements`` (vocabulary names, samples under the metric's name): the medians over the saves
    (``_record_saves``), the stall against a blocking copy (``_record_stall_vs_copy``), the load, this machine's
    limits (``_record_limits``), the schedule (``_record_schedule``) and, when ``config.time_lost_rounds`` > 0, the
    time lost per save (``time_lost.measure_time_lost``, measured first, in ``workdir/time-lost``). Scheduled with
    ``mem_basis: peak``, ``peak_bytes`` is the scenario's measured peak step memory (``_peak_gauge``).
    The trainer ends in the state of the last save. Raises ``CheckpointError`` if the round trip is not exact.
    ``on_phase`` is told each phase ("time lost", "save 2/6", "load check") for progress lines.
    ``limits`` is this machine's (raw write MB/s, copy GB/s) when the caller measured them once for its run on the
    same disk and device (``machine_limits``); measured here otherwise.
    """
    say = on_phase or (lambda text: None)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    state_device = next(trainer.model.parameters()).device
    raw_write, copy_gbps = limits if limits is not None else machine_limits(workdir, state_device)
    lost = None
    if config.time_lost_rounds > 0:
        say("time lost per save")
        lost = measure_time_lost(trainer, config, workdir / "time-lost")
    loop = _save_loop(trainer, config, workdir, probe_name, peak_bytes, stall_increase, say)
    say("load check")
    load_s = _load_and_verify(trainer, loop.ckpt)
    out = Measurements()
    _record_saves(out, config, loop.ckpt)
    _record_stall_vs_copy(out, loop.records, loop.copies)
    out.record("load_s", load_s)
    _record_limits(out, loop.ckpt, raw_write, copy_gbps, state_device)
    _record_schedule(out, config, loop, peak_bytes)
    if loop.waits:
        out.record("write_wait_s", median(loop.waits), samples=loop.waits)
    out.record("verified", "bitwise")
    if lost is not None:
        out.absorb(lost)
    return out


def machine_limits(folder: Path, device: torch.device) -> tuple[float, float]:
    """This machine's raw write bandwidth with fsync in ``folder`` (MB/s) and the copy bandwidth from ``device``
    (GB/s): the limits ``_record_limits`` reads a save against."""
    return write_bandwidth_MBps(folder), copy_bandwidth_GBps(device=device)


def _save_loop(
    trainer: Trainer, config: SaveConfig, workdir: Path, probe_name: str, peak_bytes: int | None,
    stall_increase: float, say: Callable[[str], None],
) -> _SaveLoop:
    """Train until ``config.saves`` saves happened (or the most steps a schedule may defer them), saving through a
    ``Checkpointer`` under ``workdir/checkpoints``; raises ``CheckpointError`` when none did."""
    state_device = next(trainer.model.parameters()).device
    probe = make_probe(probe_name, state_device) if probe_name else None
    step_context = contextlib.nullcontext
    if config.mem_basis == "peak":
        gauge, step_context = _peak_gauge(trainer, peak_bytes, probe_name)
    else:
        gauge = memory_gauge(state_device)
    ckpt = Checkpointer(workdir / "checkpoints", config, probe=probe, gauge=gauge)
    hook = None
    if config.mem_basis == "peak":
        hook = trainer.model.register_forward_hook(lambda *_: ckpt.schedule.observe(trainer.step + 1))
    if stall_increase:
        _lengthen_stalls(ckpt, stall_increase)
    max_steps = config.saves * (config.save_interval + config.max_defer_steps) + 1
    steps = 0
    # a staged save's stall is a copy: time that copy of the same state just before each save (stall_vs_copy)
    copy_timer = SnapshotCopyTimer() if ckpt.background else None
    copies: list[float] = []
    waits: list[float] = []
    try:
        while len(ckpt.records) < config.saves and steps < max_steps:
            with step_context():
                trainer.train_step()
            steps += 1
            say(f"save {len(ckpt.records) + 1}/{config.saves}")
            due = ckpt.schedule.may_save(trainer.step)
            if due and config.wait_for_write:
                waits.append(_wait_for_write(ckpt))
            copy_s = copy_timer.time(capture(trainer).tensors) if copy_timer and due else None
            if ckpt.maybe_save(trainer) is not None and copy_s is not None:
                copies.append(copy_s)
    finally:
        if hook is not None:
            hook.remove()
        ckpt.close()
    if not ckpt.records:
        raise CheckpointError(f"no save happened in {steps} steps with {config}")
    return _SaveLoop(ckpt, steps, copies, waits)


def _wait_for_write(ckpt: Checkpointer) -> float:
    """Wait for the background write in flight (none: returns at once); the seconds waited. Outside every timed
    span: a save then stalls for its own snapshot only, never for the previous write (back-pressure), however slow
    the disk or the host, and the save loop need not train steps just to give a write time to finish."""
    started = time.perf_counter()
    ckpt.wait()
    return time.perf_counter() - started


def _load_and_verify(trainer: Trainer, ckpt: Checkpointer) -> float:
    """Load the newest checkpoint into ``trainer`` and check every tensor it saved bit for bit against the state
    before the load (a selective save's tensors restored from its base are not its own); the load's seconds."""
    expected = {k: t.detach().to("cpu", copy=True) for k, t in capture(trainer).tensors.items()}
    last = ckpt.store.root / ckpt.records[-1].name
    loaded = load_into(trainer, last)
    saved_keys = {k for k in loaded.tensors if k not in loaded.from_base}
    mismatched = differing_keys({k: loaded.tensors[k] for k in saved_keys}, expected)
    if mismatched:
        raise CheckpointError(f"{last}: {len(mismatched)} tensors differ from the saved state after loading, e.g. {mismatched[:3]}")
    return loaded.load_s


def _record_saves(out: Measurements, config: SaveConfig, ckpt: Checkpointer) -> None:
    """``strategy``, ``format``, the median over the saves of each ``PER_SAVE_METRICS`` field with every save's value
    as samples (``COUNTED`` ones as integers) and, overlapped, ``staging`` and the median ``fence_wait_s``."""
    records = ckpt.records
    out.record("strategy", config.strategy)
    out.record("format", config.file_format)
    if ckpt.overlapped:
        out.record("staging", "overlapped")
        out.record("fence_wait_s", median([r.fence_wait_s for r in records]))
    for name in PER_SAVE_METRICS:
        values = [getattr(r, name) for r in records]
        middle = median(values)
        if name in COUNTED and middle is not None:
            middle = int(middle)
        out.record(name, middle, samples=values)


def _record_stall_vs_copy(out: Measurements, records: list[SaveRecord], copies: list[float]) -> None:
    """Staged saves: save i's stall over the copy timed just before it (``stall_vs_copy``, the gated stall ratio;
    ``bandwidth.SnapshotCopyTimer``), the copies (``snapshot_copy_s``) and the first save's own stall.

    The first save is left out: it allocates the staging buffers and starts the writer thread (2-5x a steady-state
    stall on the quiet 2-core CPU, 13-49x under load), a one-off cost that would make every run's first sample an
    outlier of its own."""
    if not len(copies) == len(records) > 1:
        return
    ratios = [r.save_stall_s / c for r, c in zip(records[1:], copies[1:])]
    out.record("snapshot_copy_s", median(copies[1:]), samples=copies[1:])
    out.record("stall_vs_copy", median(ratios), samples=ratios)
    out.record("first_save_stall_s", records[0].save_stall_s)


def _record_limits(out: Measurements, ckpt: Checkpointer, raw_write: float, copy_gbps: float, device: torch.device) -> None:
    """This machine's limits measured in the same folder in the same run (``raw_write_MBps``; ``copy_GBps``: into
    pinned memory from the device when the state is on a GPU) and the saves against them: ``snapshot_bytes``,
    ``copy_bound_s`` (the least an in-memory snapshot can stall), ``write_vs_raw``. On a GPU
    ``save_extra_peak_bytes`` is device memory only: the pinned host staging is ``save_staging_host_bytes``."""
    snapshot = ckpt.records[-1].snapshot_bytes
    out.record("raw_write_MBps", raw_write)
    out.record("copy_GBps", copy_gbps)
    out.record("snapshot_bytes", snapshot)
    out.record("copy_bound_s", snapshot / (copy_gbps * 1e9))
    write = out["write_MBps"]
    out.record("write_vs_raw", write / raw_write if write else None)  # type: ignore[operator]
    if device.type == "cuda":
        out.record("save_staging_host_bytes", ckpt.staging.nbytes)


def _record_schedule(out: Measurements, config: SaveConfig, loop: _SaveLoop, peak_bytes: int | None) -> None:
    """``saves``, ``steps``, the schedule's ``deferrals`` and ``forced_saves`` and, scheduled on the measured peak
    (``mem_basis: peak``), the threshold in bytes and the highest memory reading a save was taken at, of the peak."""
    schedule = loop.ckpt.schedule
    out.record("saves", len(loop.records))
    out.record("steps", loop.steps)
    out.record("deferrals", len(schedule.deferrals))
    out.record("forced_saves", len(schedule.forced))
    if config.mem_threshold is not None and config.mem_basis == "peak":
        out.record("mem_threshold_bytes", int(config.mem_threshold * peak_bytes))  # type: ignore[operator]
        taken = schedule.taken_fractions
        out.record("max_save_memory_fraction", max(taken) if taken else None)


def differing_keys(loaded: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> list[str]:
    """Keys whose tensors differ, compared on the CPU: checkpoints load to the CPU while a GPU run's state lives on
    the device, and ``torch.equal`` across devices raises instead of comparing."""
    return [k for k in sorted(loaded) if not torch.equal(loaded[k].detach().cpu(), expected[k].detach().cpu())]
