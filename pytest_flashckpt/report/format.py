"""Numbers a person reads: MiB, ms, %, x ratios, MB/s; a missing value is an em dash, never an empty cell.

Every number in a report goes through here, so no raw float with twelve digits reaches a table.
"""

from __future__ import annotations

MISSING = "—"

Number = float | int | None


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


FRACTIONS = ("memory_saving", "stall_vs_sync", "write_vs_raw")
"""Metrics that are fractions of something (shown as %, and compared in percentage points)."""

RATIOS = ("overhead", "overhead_min", "overhead_max", "flop_ratio")


def is_fraction(name: str) -> bool:
    return name in FRACTIONS or name.endswith("_saving")


def metric(name: str, value: object) -> str:
    """Format a metric by its name (the DESIGN.md vocabulary): ``*_bytes`` in MiB, ``*_s`` in ms, and so on."""
    if value is None or isinstance(value, (str, bool)):
        return number(value)
    assert isinstance(value, (int, float))
    if is_fraction(name):
        return pct(value)
    if name in RATIOS or name.endswith("_ratio"):
        return ratio(value)
    if name.endswith("_bytes"):
        return mib(value)
    if name.endswith("_s"):
        return ms(value)
    if name.endswith("_MBps"):
        return mbps(value)
    if name.endswith("_GBps"):
        return gbps(value)
    if name.endswith("flops"):
        return gflop(value)
    if name in ("files", "saves", "steps", "deferrals", "forced_saves"):
        return count(value)
    return number(value)


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


def p_value(value: Number) -> str:
    if value is None:
        return MISSING
    return "<0.001" if value < 0.001 else f"{value:.3f}"
