"""Numbers a person reads: MiB, ms, %, x ratios, MB/s; a missing value is an em dash, never an empty cell.

The one number formatter of the project: the report, the baseline verdict tables, ``flashckpt compare`` and the
budget messages all format through here (a metric's formatter is named in ``pytest_flashckpt.core.metrics``).
See docs/architecture.md.
"""

from __future__ import annotations

import math

MISSING = "—"

Number = float | int | None


def num(value: object) -> float | int | None:
    """``value`` when it is a number (not a bool, a text or None), else None: how every report module reads a
    metric that may be absent, a text (``mfu_absent``) or None (not measurable on this run)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def finite(value: object) -> bool:
    """``value`` is a number (as ``num`` reads one) and neither NaN nor infinite: what a gated value or a sample
    read from a results file must be (JSON's ``NaN`` / ``Infinity`` parse as floats and pass every range check)."""
    found = num(value)
    return found is not None and math.isfinite(found)


def mib(value: Number) -> str:
    return MISSING if value is None else f"{value / 2**20:,.1f} MiB"


def ms(value: Number) -> str:
    """Seconds shown as milliseconds below 1 s (stalls, fast steps), as seconds above (slow steps and saves)."""
    if value is None:
        return MISSING
    if value >= 1:
        return f"{value:,.2f} s"
    return f"{value * 1000:,.1f} ms"


def pct(value: Number) -> str:
    return MISSING if value is None else f"{value * 100:.1f}%"


def pp(value: Number) -> str:
    """A difference of two fractions, in percentage points (signed)."""
    return MISSING if value is None else f"{value * 100:+.1f} pp"


def ratio(value: Number) -> str:
    return MISSING if value is None else f"{value:.2f}x"


def spread(median: Number, low: Number, high: Number) -> str:
    """``1.24x (1.20-1.31)``: the median ratio and its min-max over rounds."""
    if median is None:
        return MISSING
    if low is None or high is None:
        return ratio(median)
    return f"{median:.2f}x ({low:.2f}-{high:.2f})"


def mbps(value: Number) -> str:
    return MISSING if value is None else f"{value:,.0f} MB/s"


def gbps(value: Number) -> str:
    return MISSING if value is None else f"{value:,.1f} GB/s"


def gflop(value: Number) -> str:
    return MISSING if value is None else f"{value / 1e9:,.2f} GFLOP"


def flops_rate(value: Number) -> str:
    """FLOP/s: ``41.3 GFLOP/s`` below 1 TFLOP/s (a CPU), ``312.0 TFLOP/s`` above (a GPU)."""
    if value is None:
        return MISSING
    return f"{value / 1e12:,.1f} TFLOP/s" if value >= 1e12 else f"{value / 1e9:,.1f} GFLOP/s"


def tokens_rate(value: Number) -> str:
    return MISSING if value is None else f"{value:,.0f} tok/s"


def count(value: Number) -> str:
    return MISSING if value is None else f"{value:,.0f}"


def number(value: object) -> str:
    """Fallback for a metric with no known unit: 4 significant digits, strings as they are."""
    if value is None:
        return MISSING
    if isinstance(value, bool) or isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def raw(value: float | None) -> str:
    """A baseline/current value as stored (verdict tables): integers with separators, else 4 significant digits;
    None (a ``missing`` verdict has no current value) is an em dash."""
    if value is None:
        return "—"
    if float(value).is_integer() and abs(value) >= 1000:
        return f"{int(value):,}"
    return f"{value:.4g}"


def relative_change(change: float | None) -> str:
    """``+12.3%``; small exact-count changes keep their digits (``+0.0056%``) instead of showing ``+0.0%``."""
    if change is None:
        return ""
    return f"{change:+.4%}" if 0 < abs(change) < 0.001 else f"{change:+.1%}"


def p_value(value: Number) -> str:
    if value is None:
        return MISSING
    return "<0.001" if value < 0.001 else f"{value:.3f}"


FORMATTERS = {
    "mib": mib, "ms": ms, "pct": pct, "ratio": ratio, "mbps": mbps, "gbps": gbps, "gflop": gflop, "count": count,
    "flops_rate": flops_rate, "tokens_rate": tokens_rate,
    "number": number,
}
