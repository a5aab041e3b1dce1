"""Memory-aware save scheduling (``save_interval`` + ``mem_threshold`` + ``max_defer_steps``).

A save falls due every ``save_interval`` steps. While memory in use is at or above ``mem_threshold`` of capacity it is
deferred (each deferral recorded with the step and the reading); after ``max_defer_steps`` steps of deferral it is
forced, so a save is never skipped forever. The gauge is injectable so tests and the runner can drive it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch

from pytest_flashckpt.files import PAGE_SIZE, resident_bytes

MemoryGauge = Callable[[], tuple[int, int]]  # () -> (bytes in use, capacity in bytes)


def memory_gauge(device: torch.device | None = None, cuda=None) -> MemoryGauge:
    """The gauge for a run on ``device``: allocated memory vs capacity of *that* GPU (``cuda:1`` is not the
    current device by default), or :func:`process_memory` on a CPU. ``cuda`` is injectable for tests."""
    if device is None or torch.device(device).type != "cuda":
        return process_memory
    cuda = torch.cuda if cuda is None else cuda
    index = torch.device(device).index
    index = cuda.current_device() if index is None else index

    def gauge() -> tuple[int, int]:
        return cuda.memory_allocated(index), cuda.get_device_properties(index).total_memory

    return gauge


def process_memory() -> tuple[int, int]:
    """Default gauge. CUDA: allocated tensor memory vs device capacity. CPU: the process's resident set vs physical
    RAM (the closest whole-process figure a CPU offers; tensor storages are not enumerable without a dispatch mode)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        device = torch.cuda.current_device()
        return torch.cuda.memory_allocated(device), torch.cuda.get_device_properties(device).total_memory
    return resident_bytes(), os.sysconf("SC_PHYS_PAGES") * PAGE_SIZE


@dataclass(frozen=True)
class Deferral:
    """A due save that waited: at ``step`` memory was ``used_bytes`` of ``capacity_bytes`` (``fraction``)."""

    step: int
    due_step: int
    used_bytes: int
    capacity_bytes: int
    fraction: float
    threshold: float


class SaveSchedule:
    """Decides at each step whether to save now; without a threshold it is a plain interval."""

    def __init__(self, interval: int, threshold: float | None, max_defer_steps: int, gauge: MemoryGauge = process_memory) -> None:
        self.interval = interval
        self.threshold = threshold
        self.max_defer_steps = max_defer_steps
        self.gauge = gauge
        self.deferrals: list[Deferral] = []
        self.forced: list[int] = []  # steps at which a deferred save was forced over the threshold
        self._due_step: int | None = None

    def should_save(self, step: int) -> bool:
        if self._due_step is None and step > 0 and step % self.interval == 0:
            self._due_step = step
        if self._due_step is None:
            return False
        if self.threshold is not None:
            used, capacity = self.gauge()
            fraction = used / capacity if capacity else 1.0
            if fraction >= self.threshold:
                if step - self._due_step < self.max_defer_steps:
                    self.deferrals.append(Deferral(step, self._due_step, used, capacity, fraction, self.threshold))
                    return False
                self.forced.append(step)
        self._due_step = None
        return True
