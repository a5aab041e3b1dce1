"""What one ``flashckpt.measure`` call measured: the ``flashckpt`` fixture's record, torch-free so the plugin can
hold and check it (``@pytest.mark.flashckpt`` budgets) without importing torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

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


FIELDS = frozenset(f.name for f in fields(Measurement))
METRIC_FIELDS = FIELDS - {"name", "probe", "device", "samples"}
assert METRIC_FIELDS <= set(METRICS), f"Measurement fields outside the metric vocabulary: {METRIC_FIELDS - set(METRICS)}"
