"""What a memory probe returns, and choosing one for a device."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Protocol

PROBES = ("cpu", "cuda", "nvml", "rss")


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


def default_probe_name(device_type: str) -> str:
    return "cuda" if device_type == "cuda" else "cpu"


def make_probe(name: str, device=None) -> MemoryProbe:
    """A probe by name; ``device`` picks the GPU for ``cuda``/``nvml``."""
    if name == "cpu":
        from pytest_flashckpt.probes.cpu import LiveTensorProbe

        return LiveTensorProbe()
    if name == "cuda":
        from pytest_flashckpt.probes.cuda import CudaAllocatorProbe

        return CudaAllocatorProbe(device)
    if name == "nvml":
        from pytest_flashckpt.probes.nvml import NvmlProbe

        return NvmlProbe(device)
    if name == "rss":
        from pytest_flashckpt.probes.rss import RssProbe

        return RssProbe()
    raise ValueError(f"unknown memory probe {name!r}; valid: {', '.join(PROBES)}")
