"""The measurement core: the passes every measurement is made of, shared by the suite runner (``runner.run``)
and the ``flashckpt`` fixture (``fixture.measure``).

- ``resident_tensors``: what is alive across steps (a module, an optimizer, tensors, or iterables of them);
- ``peak_pass``: one step under a memory probe -> a ``MemoryReading`` (peak, what was alive at its start);
- ``timing_pass``: interleaved rounds of the step and its reference -> per-round samples, medians and the
  per-round overhead with its spread (``runner.timing`` alternates the order each round);
- ``save_pass``: timed calls of a save -> per-save stall (how long the call blocks) and total (until the handle
  it returns, a future or anything with ``wait()``/``result()``, is done).

Device and probe resolution is ``runner.context``. See docs/architecture.md ("Data flow").
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from pytest_flashckpt.core.metrics import Measurements
from pytest_flashckpt.probes import MemoryReading, make_probe
from pytest_flashckpt.runner.timing import interleaved


def resident_tensors(resident: Any) -> list[torch.Tensor]:
    """Tensors alive across steps from a module, optimizer, tensor, or an iterable of those."""
    if resident is None:
        return []
    if isinstance(resident, torch.Tensor):
        return [resident]
    if isinstance(resident, torch.nn.Module):
        return list(resident.parameters()) + list(resident.buffers())
    if isinstance(resident, torch.optim.Optimizer):
        out = [p for group in resident.param_groups for p in group["params"]]
        for state in resident.state.values():
            out.extend(v for v in state.values() if isinstance(v, torch.Tensor))
        return out
    if isinstance(resident, Iterable) and not isinstance(resident, (str, bytes)):
        return [t for item in resident for t in resident_tensors(item)]
    raise TypeError(f"resident must be tensors, a module, an optimizer or an iterable of them, got {type(resident).__name__}")


def peak_pass(step: Callable[[], object], resident: Any, probe_name: str, device: torch.device) -> MemoryReading:
    """One call of ``step`` under the ``probe_name`` probe, ``resident`` counted from the start."""
    probe = make_probe(probe_name, device)
    with probe.track(resident=resident_tensors(resident)) as reading:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return reading


@dataclass
class TimingPass:
    """Per-round mean step times of the step (and its reference, when given), and what the report reads of them."""

    step_s: list[float]
    reference_s: list[float] | None = None
    confirmation_rounds: int = 0  # rounds added after the first look read slower than the baseline (0: none)

    @property
    def step_time_s(self) -> float:
        return statistics.median(self.step_s)

    @property
    def reference_step_time_s(self) -> float | None:
        return None if self.reference_s is None else statistics.median(self.reference_s)

    @property
    def overhead_samples(self) -> list[float] | None:
        """Per-round strategy / reference ratios (each round ran both, side by side)."""
        return None if self.reference_s is None else [s / r for s, r in zip(self.step_s, self.reference_s)]

    def measurements(self) -> Measurements:
        """The vocabulary's timing metrics with their per-round samples: ``step_time_s``, and with a reference
        ``reference_step_time_s``, ``overhead`` (median per-round ratio), ``overhead_min`` and ``overhead_max``."""
        out = Measurements()
        out.record("step_time_s", self.step_time_s, samples=self.step_s)
        ratios = self.overhead_samples
        if ratios is not None and self.reference_s is not None:
            out.record("reference_step_time_s", self.reference_step_time_s, samples=self.reference_s)
            out.record("overhead", statistics.median(ratios), samples=ratios)
            out.record("overhead_min", min(ratios))
            out.record("overhead_max", max(ratios))
        if self.confirmation_rounds:
            out.record("confirmation_rounds", self.confirmation_rounds)
        return out


def timing_pass(
    step: Callable[[], object], reference: Callable[[], object] | None, rounds: int, steps: int, device: torch.device,
    on_round: Callable[[int, int], None] | None = None,
    more_rounds: Callable[[list[float]], int] | None = None,
) -> TimingPass:
    """``rounds`` interleaved rounds of ``steps`` calls each (reference first in even rounds, last in odd ones).

    ``more_rounds``, with a reference: told the per-round overhead samples of that first look, it returns how many
    rounds to add before anything is judged (0: none). The suite run asks its gate (``Gate.first_look``): a
    first look that reads slower than the baseline gets confirmation rounds, so that a burst of noise in a few
    rounds is not a verdict and a real slowdown is judged on more rounds (docs/running.md, "Confirmation
    rounds"). The added rounds go on with the alternation and count like the others."""
    variants = [step] if reference is None else [reference, step]
    times = interleaved(variants, rounds, steps, device, on_round)
    added = 0
    if more_rounds is not None and reference is not None:
        added = more_rounds([s / r for s, r in zip(times[1], times[0])])
        if added > 0:
            more = interleaved(variants, added, steps, device, on_round, first_round=rounds)
            for kept, new in zip(times, more):
                kept.extend(new)
    return TimingPass(times[-1], None if reference is None else times[0], confirmation_rounds=max(added, 0))


@dataclass
class SavePass:
    stall_s: list[float] = field(default_factory=list)
    total_s: list[float] = field(default_factory=list)

    def measurements(self) -> Measurements:
        """``save_stall_s`` and ``save_total_s``: medians over the saves, with the per-save samples."""
        out = Measurements()
        out.record("save_stall_s", statistics.median(self.stall_s), samples=self.stall_s)
        out.record("save_total_s", statistics.median(self.total_s), samples=self.total_s)
        return out


def _wait(handle: Any) -> None:
    for method in ("result", "wait"):
        if callable(getattr(handle, method, None)):
            getattr(handle, method)()
            return


def save_pass(save: Callable[[], object], saves: int) -> SavePass:
    """``saves`` timed calls of ``save``: the stall until it returns, the total until its handle is done."""
    out = SavePass()
    for _ in range(saves):
        begin = time.perf_counter()
        handle = save()
        out.stall_s.append(time.perf_counter() - begin)
        _wait(handle)
        out.total_s.append(time.perf_counter() - begin)
    return out
