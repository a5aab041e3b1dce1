"""The ``activation.budget`` value of the ``budget`` strategy, parsed without torch (config validation runs in
pytest's collection, which must not import torch).

Accepted: a size (``"6 GiB"``, ``"512MB"``, a whole number of bytes), a fraction in (0, 1] of the no-checkpointing
peak at the input shape (``0.6``; the string ``"0.6"`` too, as ``flashckpt simulate --budget 0.6`` passes it), ``"min"`` (the smallest peak any plan reaches there) or ``"min + 30%"`` (30% of
the way from that minimum to the no-checkpointing peak: what a sweep over reachable budgets steps through).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pytest_flashckpt.core.units import SIZE_FORMATS, parse_size

_MIN_PLUS = re.compile(r"^\s*min\s*\+\s*([0-9]+(?:\.[0-9]*)?)\s*%\s*$")
_NUMBER = re.compile(r"^[0-9]+(?:\.[0-9]*)?$|^\.[0-9]+$")  # a bare number, as a command line hands it over


def format_bytes(value: int) -> str:
    """``123456789`` -> ``117.7 MiB (123,456,789 bytes)``."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:,.1f} {unit} ({value:,} bytes)"
    return f"{value:,} bytes"


@dataclass(frozen=True)
class BudgetSpec:
    """A budget as configured: ``bytes`` (a physical peak), ``fraction`` of the no-checkpointing peak, or
    ``span`` of the way from the smallest achievable peak to the no-checkpointing peak (``"min + 30%"``)."""

    kind: str
    value: float

    @classmethod
    def parse(cls, value: str | int | float) -> "BudgetSpec":
        """Reads ``"6 GiB"``, ``123456789`` (bytes), ``0.6`` (fraction in (0, 1]), ``"min"``, ``"min + 30%"``;
        a ValueError naming ``activation.budget`` otherwise."""
        accepted = f"expected {SIZE_FORMATS}; a fraction in (0, 1] of the no-checkpointing peak (0.6); 'min'; or 'min + 30%'"
        if isinstance(value, bool):
            raise ValueError(f"activation.budget: {value!r} is not a budget; {accepted}")
        if isinstance(value, str) and _NUMBER.match(value.strip()):  # "0.6" means what 0.6 means, not 0.6 bytes
            value = float(value) if "." in value else int(value)
        if isinstance(value, (int, float)):
            if 0.0 < value <= 1.0:
                return cls("fraction", float(value))
            if value > 1 and float(value).is_integer():
                return cls("bytes", int(value))
            raise ValueError(f"activation.budget: {value!r} is neither a fraction in (0, 1] nor a whole number of bytes; {accepted}")
        if isinstance(value, str):
            text = value.strip().lower()
            if text == "min":
                return cls("span", 0.0)
            match = _MIN_PLUS.match(text)
            if match:
                span = float(match.group(1)) / 100
                if span > 1:
                    raise ValueError(f"activation.budget: {value!r} goes past the no-checkpointing peak; use at most 'min + 100%'")
                return cls("span", span)
        try:
            size = parse_size(value)
        except ValueError as exc:
            raise ValueError(f"activation.budget: {exc}; or a fraction in (0, 1] (0.6), 'min', 'min + 30%'") from None
        if size <= 0:
            raise ValueError(f"activation.budget: {value!r} is zero bytes; {accepted}")
        return cls("bytes", size)

    def resolve(self, costs, minimum: int) -> int:
        """Bytes at one shape; ``costs`` is the shape's ``PlanCosts`` (its ``none_peak()``), ``minimum`` the
        smallest achievable peak there."""
        if self.kind == "bytes":
            return int(self.value)
        none_peak = costs.none_peak()
        if self.kind == "fraction":
            return int(self.value * none_peak)
        return minimum + int(self.value * (none_peak - minimum))

    def describe(self) -> str:
        if self.kind == "bytes":
            return format_bytes(int(self.value))
        if self.kind == "fraction":
            return f"{self.value:g} x the no-checkpointing peak"
        return f"min + {self.value * 100:g}% of (no-checkpointing peak - min)"
