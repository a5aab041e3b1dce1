"""The ``flashckpt`` fixture: measure your own model's training step with the suite's probes and timing.

    def test_my_model(flashckpt):
        m = flashckpt.measure(step, resident=model, reference=plain_step, rounds=5)
        assert m.overhead < 1.5            # or declare it: @pytest.mark.flashckpt(max_overhead=1.5)

``measure`` runs: warm-up calls, one step under a memory probe (peak bytes, exact on the CPU), interleaved
timing rounds against ``reference`` (the same step without the strategy under test; ratios cancel machine
noise), and optionally ``saves`` timed calls of ``save`` (stall = how long the call blocks; total = until the
handle it returns, a future or anything with ``wait()``/``result()``, is done). Torch is imported inside
``measure``, so merely having the plugin installed stays free.

The peak cannot read short of what the step holds: ``resident`` is read after the warm-up (a fresh optimizer's
AdamW state, made by the first step, counts), and on the ``cpu`` probe any tensor the step uses that was alive
before it (not passed as resident: the reference's model and optimizer, a batch) is found and the step measured
again with it counted from the start. On the ``cuda``/``nvml`` probes, ``reference_resident`` defaults to
``resident``. ``tests/fixture/test_fixture_true_peak.py`` checks the README pattern on a Hugging Face GPT-2
against torch's ``MemTracker``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Iterable

import pytest

from pytest_flashckpt.core.metrics import METRICS


@dataclass
class Measurement:
    """What one ``flashckpt.measure`` call measured (metric names of ``pytest_flashckpt.core.metrics``); None = not measured."""

    name: str | None
    probe: str
    device: str
    peak_bytes: int | None = None
    state_bytes: int | None = None
    reference_peak_bytes: int | None = None
    memory_saving: float | None = None
    step_time_s: float | None = None
    reference_step_time_s: float | None = None
    overhead: float | None = None
    save_stall_s: float | None = None
    save_total_s: float | None = None
    samples: dict[str, list[float]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_FIELDS = {f.name for f in fields(Measurement)}
_METRIC_FIELDS = _FIELDS - {"name", "probe", "device", "samples"}
assert _METRIC_FIELDS <= set(METRICS), f"Measurement fields outside the metric vocabulary: {_METRIC_FIELDS - set(METRICS)}"


def _device_of(tensors: Iterable) -> Any:
    """The device the given tensors live on (a GPU wins over the CPU), or None when there are none. With
    ``device="auto"`` this is what is measured: a CPU model on a machine with a GPU is measured with the cpu probe
    (the cuda probe would read 0 bytes for it and every budget would pass)."""
    devices = {t.device for t in tensors}
    cuda = sorted((d for d in devices if d.type == "cuda"), key=lambda d: d.index or 0)
    return cuda[0] if cuda else (next(iter(devices)) if devices else None)


def _watch_devices(step: Callable[[], object]) -> list:
    """Run ``step`` once (a warm-up step) and return the tensors its ops produced, to see where it runs."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    import torch

    seen: dict = {}

    class _Devices(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    seen.setdefault(t.device, t.new_empty(0))
            return out

    with _Devices():
        step()
    return list(seen.values())


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
    """Measure ``step`` (and ``reference``, ``save`` when given); pytest-free, usable from plain Python too.

    ``device="auto"`` measures where the ``resident`` tensors live, else where the first warm-up step's tensors
    live, else on CUDA when present; ``probe="auto"`` then follows that device."""
    if rounds <= 0 or steps <= 0 or warmup < 0 or saves <= 0:
        raise ValueError(f"rounds, steps and saves must be positive and warmup >= 0 (got {rounds}, {steps}, {saves}, {warmup})")
    from pytest_flashckpt.runner.context import resolve_device, resolve_probe
    from pytest_flashckpt.runner.passes import resident_tensors, save_pass, timing_pass

    resident_list = resident_tensors(resident)
    if device == "auto":  # where the resident tensors live, else where the first warm-up step runs
        dev = _device_of(resident_list)
        if dev is None and warmup > 0:
            dev = _device_of(_watch_devices(step))
            if reference is not None:
                reference()
            warmup -= 1
        dev = dev if dev is not None else resolve_device("auto")
    else:
        dev = resolve_device(device)
    probe_name = resolve_probe(probe, dev)
    out = Measurement(name=name, probe=probe_name, device=str(dev))
    for _ in range(warmup):
        step()
        if reference is not None:
            reference()
    resident_list = resident_tensors(resident)  # again, after the warm-up: a fresh optimizer's state exists now
    reading = _complete_peak_pass(step, resident_list, probe_name, dev)
    out.peak_bytes, out.state_bytes = reading.peak_bytes, reading.start_bytes
    if reference is not None:
        if reference_resident is None and probe_name != "cpu":  # the cpu probe finds them itself (_complete_peak_pass)
            reference_resident = resident
        out.reference_peak_bytes = _complete_peak_pass(reference, resident_tensors(reference_resident), probe_name, dev).peak_bytes
        if out.reference_peak_bytes:
            out.memory_saving = 1.0 - out.peak_bytes / out.reference_peak_bytes
    timing = timing_pass(step, reference, rounds, steps, dev).measurements()
    out.samples.update(timing.samples)
    for key, value in timing.values.items():
        if key in _FIELDS:
            setattr(out, key, value)
    if save is not None:
        saved = save_pass(save, saves).measurements()
        out.samples.update(saved.samples)
        out.save_stall_s, out.save_total_s = saved.values["save_stall_s"], saved.values["save_total_s"]
    return out


def _complete_peak_pass(step: Callable[[], object], resident: list, probe_name: str, dev):
    """``runner.passes.peak_pass``, made unable to read short on the exact ``cpu`` probe: tensors the step used that
    were alive before it but not passed as resident (an optimizer's moments, a batch, a second model) are counted
    by the probe only from their first use, which can fall after the peak; the probe names them (``adopted``) and
    the step is measured once more with them resident, so they count from the start as they are held."""
    from pytest_flashckpt.probes import make_probe
    from pytest_flashckpt.runner.passes import peak_pass

    if probe_name != "cpu":
        return peak_pass(step, resident, probe_name, dev)
    probe = make_probe(probe_name, dev)
    with probe.track(resident=resident) as reading:
        step()
    adopted = probe.adopted()
    if not adopted:
        return reading
    return peak_pass(step, [*resident, *adopted], probe_name, dev)


class FlashckptFixture:
    """The object the ``flashckpt`` fixture yields; keeps every measurement for the marker's budget check."""

    def __init__(self, node: pytest.Item) -> None:
        self.node = node
        self.measurements: list[Measurement] = []

    def measure(self, step: Callable[[], object], **kwargs: Any) -> Measurement:
        """See ``pytest_flashckpt.plugin.fixture.measure``; numeric results also become JUnit properties."""
        result = measure(step, **kwargs)
        self.measurements.append(result)
        prefix = f"{result.name}." if result.name else ""
        for key, value in result.as_dict().items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.node.user_properties.append((f"flashckpt.{prefix}{key}", value))
        return result


@pytest.fixture
def flashckpt(request: pytest.FixtureRequest) -> FlashckptFixture:
    """Measure your own training step: ``flashckpt.measure(step, resident=model, reference=plain_step)``; budgets
    from ``@pytest.mark.flashckpt(...)`` are checked after the test body."""
    return FlashckptFixture(request.node)
