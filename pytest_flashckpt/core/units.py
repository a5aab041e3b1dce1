"""Human-written sizes and durations for budgets: ``"2 GiB"``, ``"512MB"``, ``"50 ms"``, ``"1.5s"``.

Binary (KiB, MiB, GiB, TiB) and decimal (kB, MB, GB, TB) size units are both accepted because people write both;
they differ by ~7% at GiB, which is larger than a memory budget's usual slack, so we never guess one for the
other. A bare number is bytes or seconds. Anything else is a ``ValueError`` naming the accepted formats.
"""

from __future__ import annotations

import math
import re

SIZE_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
DURATION_UNITS: dict[str, float] = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0}

_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?\s*([a-zA-Zµ]*)\s*$")

SIZE_FORMATS = "a number of bytes or a number with a unit: B, kB, MB, GB, TB, KiB, MiB, GiB, TiB (e.g. '2 GiB', '512MB')"
DURATION_FORMATS = "a number of seconds or a number with a unit: ns, us, ms, s, min (e.g. '50 ms', '1.5s')"


def _split(text: str) -> tuple[float, str] | None:
    match = _QUANTITY.match(text)
    if match is None:
        return None
    number = float(match.group(1) + (f"e{match.group(2)}" if match.group(2) else ""))
    return number, match.group(3).lower()


def _parse_quantity(value: str | int | float, kind: str, units: dict[str, float], bare_unit: str, formats: str) -> float:
    """A non-negative number in ``units`` (a bare number counts in ``bare_unit``); a clear ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a {kind}; expected {formats}")
    if isinstance(value, (int, float)):
        number, unit = float(value), bare_unit
    else:
        parsed = _split(str(value))
        if parsed is None:
            raise ValueError(f"{value!r} is not a {kind}; expected {formats}")
        number, unit = parsed[0], parsed[1] or bare_unit
    if unit not in units:
        raise ValueError(f"{value!r}: unknown {kind} unit {unit!r}; expected {formats}")
    if number < 0:
        raise ValueError(f"{value!r}: a {kind} cannot be negative; expected {formats}")
    if not math.isfinite(number * units[unit]):  # NaN, or '1e400 GiB' (an OverflowError when made bytes)
        raise ValueError(f"{value!r} is not a finite {kind}; expected {formats}")
    return number * units[unit]


def parse_size(value: str | int | float) -> int:
    """Bytes from ``"2 GiB"``, ``"512MB"``, ``1024``; negative, unknown units and junk are ValueErrors."""
    return int(round(_parse_quantity(value, "size", SIZE_UNITS, "b", SIZE_FORMATS)))


def parse_duration(value: str | int | float) -> float:
    """Seconds from ``"50 ms"``, ``"1.5s"``, ``0.2``; negative, unknown units and junk are ValueErrors."""
    return _parse_quantity(value, "duration", DURATION_UNITS, "s", DURATION_FORMATS)
