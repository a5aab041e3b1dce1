"""Numbers a person reads: MiB, ms, %, x ratios; a missing value is an em dash, never an empty cell."""

from __future__ import annotations

MISSING = "—"


def mib(value) -> str:
    return MISSING if value is None else f"{value / 2**20:,.1f} MiB"


def ms(value) -> str:
    return MISSING if value is None else f"{value * 1000:,.1f} ms"


def pct(value) -> str:
    return MISSING if value is None else f"{value * 100:.1f}%"


def ratio(value) -> str:
    return MISSING if value is None else f"{value:.2f}x"
