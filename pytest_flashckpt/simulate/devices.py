"""Device memory sizes for fits / headroom (no torch: the CLI and the report import this)."""

from __future__ import annotations

from pytest_flashckpt.core.units import SIZE_FORMATS, parse_size

# The report's columns: 24 / 40 / 80 / 141 GB cards (RTX 4090 / A100-40 / A100-80, H100 / H200), in decimal GB,
# which is a little less than the cards hold (24, 40, 80 GiB and ~140 GiB): a "fits" here is conservative.
REPORT_DEVICES: tuple[tuple[str, int], ...] = (("24 GB", 24 * 10**9), ("40 GB", 40 * 10**9), ("80 GB", 80 * 10**9), ("141 GB", 141 * 10**9))


def parse_device_memory(text: str) -> int:
    """Bytes from ``80GiB``, ``40 GB``...; a ValueError naming the value otherwise (a bare 0 is refused too)."""
    try:
        size = parse_size(text)
    except ValueError as exc:
        raise ValueError(f"device memory: {exc}") from None
    if size <= 0:
        raise ValueError(f"device memory {text!r} must be more than zero bytes; expected {SIZE_FORMATS}")
    return size


def gib(nbytes: int) -> str:
    """GiB with two decimals; MiB below 1 GiB (small cards)."""
    if abs(nbytes) < 2**30:
        return f"{nbytes / 2**20:.1f} MiB"
    return f"{nbytes / 2**30:.2f} GiB"


def verdict(peak_bytes: int, device_bytes: int) -> str:
    """``fits (headroom 55.31 GiB, 69%)`` or ``does not fit (short by 3.20 GiB)``."""
    headroom = device_bytes - peak_bytes
    if headroom >= 0:
        return f"fits (headroom {gib(headroom)}, {headroom / device_bytes:.0%} of the device)"
    return f"does not fit (short by {gib(-headroom)})"
