"""The ``flashckpt`` fixture: measure your own model's training step with the suite's probes and timing.

    def test_my_model(flashckpt):
        m = flashckpt.measure(step, resident=model, reference=plain_step, rounds=5)
        assert m.overhead < 1.5            # or declare it: @pytest.mark.flashckpt(max_overhead=1.5)

``measure`` runs: warm-up calls, one step under a memory probe (peak bytes, exact on the CPU), interleaved
timing rounds against ``reference`` (the same step without the strategy under test; ratios cancel machine
noise), and optionally ``saves`` timed calls of ``save`` (stall = how long the call blocks; total = until the
handle it returns, a future or anything with ``wait()``/``result()``, is done). Torch is imported inside
``measure``, so merely having the plugin installed stays free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable

import pytest

from pytest_flashckpt.metrics import METRICS


@dataclass
class Measurement:
    """What one ``flashckpt.measure`` call measured (metric names of ``pytest_flashckpt.metrics``); None = not measured."""

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
    """Measure ``step`` (and ``reference``, ``save`` when given); pytest-free, usable from plain Python too."""
    if rounds <= 0 or steps <= 0 or warmup < 0 or saves <= 0:
        raise ValueError(f"rounds, steps and saves must be positive and warmup >= 0 (got {rounds}, {steps}, {saves}, {warmup})")
    from pytest_flashckpt.runner.context import resolve_device, resolve_probe
    from pytest_flashckpt.runner.passes import peak_pass, save_pass, timing_pass

    dev = resolve_device(device)
    probe_name = resolve_probe(probe, dev)
    out = Measurement(name=name, probe=probe_name, device=str(dev))
    for _ in range(warmup):
        step()
        if reference is not None:
            reference()
    reading = peak_pass(step, resident, probe_name, dev)
    out.peak_bytes, out.state_bytes = reading.peak_bytes, reading.start_bytes
    if reference is not None:
        out.reference_peak_bytes = peak_pass(reference, reference_resident, probe_name, dev).peak_bytes
        if out.reference_peak_bytes:
            out.memory_saving = 1.0 - out.peak_bytes / out.reference_peak_bytes
    timing = timing_pass(step, reference, rounds, steps, dev)
    out.samples.update(timing.samples())
    for key, value in timing.metrics().items():
        if key in _FIELDS:
            setattr(out, key, value)
    if save is not None:
        saved = save_pass(save, saves)
        out.samples.update(saved.samples())
        out.save_stall_s, out.save_total_s = saved.metrics()["save_stall_s"], saved.metrics()["save_total_s"]
    return out


class FlashckptFixture:
    """The object the ``flashckpt`` fixture yields; keeps every measurement for the marker's budget check."""

    def __init__(self, node: pytest.Item) -> None:
        self.node = node
        self.measurements: list[Measurement] = []

    def measure(self, step: Callable[[], object], **kwargs: Any) -> Measurement:
        """See ``pytest_flashckpt.fixture.measure``; numeric results also become JUnit properties."""
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
