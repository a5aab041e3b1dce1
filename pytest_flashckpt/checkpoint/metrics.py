"""Per-save measurements, named as in the metric vocabulary (``pytest_flashckpt.core.metrics``), and their medians.

``PER_SAVE_METRICS``: the ``SaveRecord`` fields a checkpoint pass records as the median over its saves, with every
save's value as the samples (the vocabulary's ``per_save`` rows); ``COUNTED`` among them are whole numbers (their
rows' ``whole``: bytes and files), so their median is an integer."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from pytest_flashckpt.core.metrics import METRICS, PER_SAVE

PER_SAVE_METRICS = PER_SAVE
COUNTED = tuple(name for name in PER_SAVE if METRICS[name].whole)


@dataclass
class SaveRecord:
    """One save. ``save_stall_s``: the training loop was blocked (incl. waiting for a previous async save);
    ``save_total_s``: until durable and committed; ``write_s``: tensor files written and fsynced;
    ``write_MBps`` = bytes_written / write_s; ``save_extra_peak_bytes``: memory the save adds (staging buffers,
    exact, plus the transient peak the probe sees in the blocking part). Overlapped staging: ``save_stall_s`` is the
    save call plus ``fence_wait_s`` (the training loop blocked on the copy at the next ``optimizer.step()``)."""

    step: int
    name: str
    strategy: str
    save_stall_s: float = 0.0
    wait_s: float = 0.0
    snapshot_s: float = 0.0
    fence_wait_s: float = 0.0  # overlapped staging: time the optimizer step (or a fence() call) waited for the copy
    save_total_s: float | None = None
    write_s: float | None = None
    bytes_written: int = 0
    snapshot_bytes: int = 0
    save_extra_peak_bytes: int = 0
    files: int = 0
    forced: bool = False
    base: str | None = None  # selective: the full checkpoint this one is restored on top of
    error: str | None = None
    done: bool = False

    @property
    def write_MBps(self) -> float | None:
        return self.bytes_written / 1e6 / self.write_s if self.write_s else None


def median(values: list[float | int | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None
