"""Formatting for the report: the metric vocabulary's formatters (``pytest_flashckpt.core.metrics``, ``numbers``) and
the change of a metric between two runs. Every number in a report goes through here.
"""

from __future__ import annotations

from pytest_flashckpt.core.metrics import format_metric as metric, is_fraction
from pytest_flashckpt.core.numbers import (  # noqa: F401  (the report's formatters; defined once in numbers.py)
    MISSING, Number, count, gbps, gflop, mbps, mib, ms, number, p_value, pct, pp, ratio, spread,
)

__all__ = [
    "MISSING", "change", "count", "gbps", "gflop", "is_fraction", "mbps", "metric", "mib", "ms", "number", "p_value",
    "pct", "pp", "ratio", "spread",
]


def change(name: str, before: object, after: object) -> str:
    """B against A: percentage points for fractions, a relative % otherwise."""
    if not isinstance(before, (int, float)) or not isinstance(after, (int, float)):
        return MISSING
    if isinstance(before, bool) or isinstance(after, bool):
        return MISSING
    if is_fraction(name):
        return pp(after - before)
    if before == 0:
        return "0.0%" if after == 0 else MISSING
    return f"{(after - before) / abs(before) * 100:+.1f}%"
