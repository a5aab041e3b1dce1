"""The schedule axis of a save: ``every`` (a save every ``save_interval`` steps) or ``memory_aware`` (the same,
deferred while memory is high: ``mem_threshold`` + ``max_defer_steps``); :func:`schedule_for` builds it.

A save falls due every ``save_interval`` steps. While memory in use is at or above ``mem_threshold`` of capacity it is
deferred (each deferral recorded with the step and the reading); after ``max_defer_steps`` steps of deferral it is
forced, so a save is never skipped forever. The gauge is injectable so tests and the runner can drive it.

Where the schedule looks: after every optimizer step (``should_save``: the only place a save can be taken, the
state is consistent there) and, when the training loop calls ``observe``, in the middle of a step (after the
forward pass, while the step's activations are alive). A save that falls due during a step and sees memory above
the threshold there is recorded as deferred (phase ``mid-step``) and waits for the step's end, as a save requested
by a timer or a signal would. With ``mem_basis: peak`` (``config.scenario.SaveConfig``) the capacity is the
scenario's measured peak step memory and the gauge counts live tensor bytes, so the threshold is a fraction of
what this workload really uses, not of a host's RAM that a small model never approaches.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch

from pytest_flashckpt.config.scenario import SaveConfig
from pytest_flashckpt.core.files import PAGE_SIZE, resident_bytes

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
    phase: str = "step end"  # "mid-step" (after the forward pass) or "step end" (after the optimizer step)


def schedule_for(config: SaveConfig, gauge: MemoryGauge = process_memory) -> "SaveSchedule":
    """The schedule ``config.axes.schedule`` names (a ``SaveConfig``): memory-aware reads ``gauge`` against
    ``mem_threshold`` (the seed's ``scheduled`` preset written without one has nothing to defer for); ``every``
    never reads memory."""
    threshold = config.mem_threshold if config.axes.schedule == "memory_aware" else None
    return SaveSchedule(config.save_interval, threshold, config.max_defer_steps, gauge)


class SaveSchedule:
    """Decides at each step whether to save now; without a threshold it is a plain interval."""

    def __init__(self, interval: int, threshold: float | None, max_defer_steps: int, gauge: MemoryGauge = process_memory) -> None:
        self.interval = interval
        self.threshold = threshold
        self.max_defer_steps = max_defer_steps
        self.gauge = gauge
        self.deferrals: list[Deferral] = []
        self.forced: list[int] = []  # steps at which a deferred save was forced over the threshold
        self.taken_fractions: list[float] = []  # memory fraction read when each save was taken (threshold set)
        self._due_step: int | None = None

    def _reading(self) -> tuple[int, int, float]:
        used, capacity = self.gauge()
        return used, capacity, (used / capacity if capacity else 1.0)

    def observe(self, step: int) -> None:
        """A look in the middle of step ``step`` (1-based: the step being run): a save due in it that sees memory at
        or above the threshold is recorded as deferred to the step's end. Never takes a save."""
        if self.threshold is None:
            return
        due = self._due_step if self._due_step is not None else (step if step % self.interval == 0 else None)
        if due is None:
            return
        used, capacity, fraction = self._reading()
        if fraction >= self.threshold:
            self.deferrals.append(Deferral(step, due, used, capacity, fraction, self.threshold, phase="mid-step"))

    def may_save(self, step: int) -> bool:
        """Whether :meth:`should_save` could say yes at ``step`` (a save is due or pending); changes nothing."""
        return self._due_step is not None or (step > 0 and step % self.interval == 0)

    def should_save(self, step: int) -> bool:
        if self._due_step is None and step > 0 and step % self.interval == 0:
            self._due_step = step
        if self._due_step is None:
            return False
        if self.threshold is not None:
            used, capacity, fraction = self._reading()
            self.taken_fractions.append(fraction)
            if fraction >= self.threshold:
                if step - self._due_step < self.max_defer_steps:
                    self.taken_fractions.pop()
                    self.deferrals.append(Deferral(step, self._due_step, used, capacity, fraction, self.threshold))
                    return False
                self.forced.append(step)
        self._due_step = None
        return True
