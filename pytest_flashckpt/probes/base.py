"""What a memory probe returns, and choosing one by name (the probes are registered in ``pytest_flashckpt.core.registry``)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Iterable, Protocol

from pytest_flashckpt.core.registry import PROBE_NAMES, PROBES, default_probe_name

__all__ = ["MemoryProbe", "MemoryReading", "PROBE_NAMES", "PROBES", "default_probe_name", "make_probe"]


@dataclass
class MemoryReading:
    """One tracked region. ``peak_bytes`` is the most memory alive at once (what the metric ``peak_bytes`` means);
    ``start_bytes`` what was alive when tracking began; ``exact`` is False for sampled probes (a lower bound)."""

    probe: str
    peak_bytes: int = 0
    start_bytes: int = 0
    end_bytes: int = 0
    exact: bool = True
    extra: dict[str, int | float | str] = field(default_factory=dict)

    @property
    def added_peak_bytes(self) -> int:
        """How much the region added on top of what was alive at its start."""
        return self.peak_bytes - self.start_bytes


class MemoryProbe(Protocol):
    name: str

    def track(self, resident: Iterable = ()):  # -> context manager yielding MemoryReading
        ...


def make_probe(name: str, device=None) -> MemoryProbe:
    """A probe by name; ``device`` picks the GPU for ``cuda``/``nvml``. The class is imported only when asked for
    (``cuda``/``nvml`` need a GPU stack), so this module names no probe module statically."""
    spec = PROBES.get(name)
    if spec is None:
        raise ValueError(f"unknown memory probe {name!r}; valid: {', '.join(PROBE_NAMES)}")
    module, _, cls = spec.target.partition(":")
    factory = getattr(importlib.import_module(module), cls)
    return factory(device) if spec.takes_device else factory()
