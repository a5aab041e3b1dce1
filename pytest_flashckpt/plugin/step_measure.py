"""``measure``: the ``flashckpt`` fixture's measurement of a user's own training step, pytest-free (usable from
plain Python too) and importing torch, so the fixture imports it only when ``measure`` is called.

It runs: warm-up calls, one step under a memory probe (peak bytes, exact on the CPU), interleaved timing rounds
against ``reference`` (the same step without the strategy under test; ratios cancel machine noise), and
optionally ``saves`` timed calls of ``save`` (stall = how long the call blocks; total = until the handle it
returns, a future or anything with ``wait()``/``result()``, is done).

The peak cannot read short of what the step holds: ``resident`` is read after the warm-up (a fresh optimizer's
AdamW state, made by the first step, counts), and on the ``cpu`` probe any tensor the step uses that was alive
before it (not passed as resident: the reference's model and optimizer, a batch) is found and the step measured
again with it counted from the start. On the ``cuda``/``nvml`` probes, ``reference_resident`` defaults to
``resident``. ``tests/fixture/test_fixture_true_peak.py`` checks the README pattern on a Hugging Face GPT-2
against torch's ``MemTracker``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pytest_flashckpt.plugin.measurement import FIELDS, Measurement
from pytest_flashckpt.probes import make_probe
from pytest_flashckpt.runner.context import resolve_device, resolve_probe
from pytest_flashckpt.runner.passes import peak_pass, resident_tensors, save_pass, timing_pass


def measure(
    step: Callable[[], object],
    *,
    resident: Any = None,
    reference: Callable[[], object] | None = None,
    reference_resident: Any = None,
    rounds: int = 5,
    steps: int = 1,
    warmup: int = 1,
    save: Callable[[], object] | None = None,
    saves: int = 3,
    probe: str = "auto",
    device: str = "auto",
    name: str | None = None,
) -> Measurement:
    """Measure ``step`` (and ``reference``, ``save`` when given).

    ``device="auto"`` measures where the ``resident`` tensors live, else where the first warm-up step's tensors
    live, else on CUDA when present; ``probe="auto"`` then follows that device."""
    if rounds <= 0 or steps <= 0 or warmup < 0 or saves <= 0:
        raise ValueError(f"rounds, steps and saves must be positive and warmup >= 0 (got {rounds}, {steps}, {saves}, {warmup})")
    dev, warmup = _measured_device(step, reference, resident, warmup, device)
    probe_name = resolve_probe(probe, dev)
    out = Measurement(name=name, probe=probe_name, device=str(dev))
    for _ in range(warmup):
        _call_both(step, reference)
    _measure_peaks(out, step, reference, resident, reference_resident, dev)
    timing = timing_pass(step, reference, rounds, steps, dev).measurements()
    out.samples.update(timing.samples)
    for key, value in timing.values.items():
        if key in FIELDS:
            setattr(out, key, value)
    if save is not None:
        saved = save_pass(save, saves).measurements()
        out.samples.update(saved.samples)
        out.save_stall_s, out.save_total_s = saved.values["save_stall_s"], saved.values["save_total_s"]
    return out


def _call_both(step: Callable[[], object], reference: Callable[[], object] | None) -> None:
    step()
    if reference is not None:
        reference()


def _measured_device(
    step: Callable[[], object], reference: Callable[[], object] | None, resident: Any, warmup: int, device: str,
) -> tuple[torch.device, int]:
    """The device to measure on and the warm-up steps still to run: with ``device="auto"``, where the resident
    tensors live, else where the first warm-up step runs (that step is then one of the warm-up's), else CUDA when
    present."""
    if device != "auto":
        return resolve_device(device), warmup
    dev = device_of(resident_tensors(resident))
    if dev is None and warmup > 0:
        dev = device_of(_watch_devices(step))
        if reference is not None:
            reference()
        warmup -= 1
    return (dev if dev is not None else resolve_device("auto")), warmup


def _measure_peaks(
    out: Measurement, step: Callable[[], object], reference: Callable[[], object] | None, resident: Any,
    reference_resident: Any, dev: torch.device,
) -> None:
    """``peak_bytes`` and ``state_bytes`` of ``step`` and, with a ``reference``, its peak and the memory saving.
    ``resident`` is read here, after the warm-up: a fresh optimizer's state exists now."""
    reading = _complete_peak_pass(step, resident_tensors(resident), out.probe, dev)
    out.peak_bytes, out.state_bytes = reading.peak_bytes, reading.start_bytes
    if reference is None:
        return
    if reference_resident is None and out.probe != "cpu":  # the cpu probe finds them itself (_complete_peak_pass)
        reference_resident = resident
    out.reference_peak_bytes = _complete_peak_pass(reference, resident_tensors(reference_resident), out.probe, dev).peak_bytes
    if out.reference_peak_bytes:
        out.memory_saving = 1.0 - out.peak_bytes / out.reference_peak_bytes


def device_of(tensors: Iterable) -> Any:
    """The device the given tensors live on (a GPU wins over the CPU), or None when there are none. With
    ``device="auto"`` this is what is measured: a CPU model on a machine with a GPU is measured with the cpu probe
    (the cuda probe would read 0 bytes for it and every budget would pass)."""
    devices = {t.device for t in tensors}
    cuda = sorted((d for d in devices if d.type == "cuda"), key=lambda d: d.index or 0)
    return cuda[0] if cuda else (next(iter(devices)) if devices else None)


class _SeenDevices(TorchDispatchMode):
    """Notes one empty tensor per device the ops under it produce tensors on (meta excluded)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self.seen.setdefault(t.device, t.new_empty(0))
        return out


def _watch_devices(step: Callable[[], object]) -> list:
    """Run ``step`` once (a warm-up step) and return the tensors its ops produced, to see where it runs."""
    with _SeenDevices() as watch:
        step()
    return list(watch.seen.values())


def _complete_peak_pass(step: Callable[[], object], resident: list, probe_name: str, dev):
    """``runner.passes.peak_pass``, made unable to read short on the exact ``cpu`` probe: tensors the step used that
    were alive before it but not passed as resident (an optimizer's moments, a batch, a second model) are counted
    by the probe only from their first use, which can fall after the peak; the probe names them (``adopted``) and
    the step is measured once more with them resident, so they count from the start as they are held."""
    if probe_name != "cpu":
        return peak_pass(step, resident, probe_name, dev)
    probe = make_probe(probe_name, dev)
    with probe.track(resident=resident) as reading:
        step()
    adopted = probe.adopted()
    if not adopted:
        return reading
    return peak_pass(step, [*resident, *adopted], probe_name, dev)
