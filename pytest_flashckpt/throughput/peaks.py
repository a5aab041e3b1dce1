"""Datasheet peak FLOP/s of a device, or the reason there is none: never a guess.

The table is data (``device_peaks.yaml`` beside this module): one row per product with the exact device names
torch (``torch.cuda.get_device_name``) and NVML report for it, dense peaks per precision and the vendor document
each number comes from. :func:`lookup` matches a name exactly (case and spacing aside): a similar name (``NVIDIA
H100`` for ``NVIDIA H100 80GB HBM3``, an ``A10G`` for an ``A10``) is refused, because the field's known failure is
the wrong constant (sparse for dense, SXM for PCIe, bf16 for fp8), which has produced MFU above 100%. A refusal
carries its reason, which the report prints where MFU would be.

CPUs are refused by design: their datasheet peaks (vector width x FMA units x a clock the run may not get) are not
comparable, so on a CPU the measured matmul roofline (``throughput.roofline``) is the only peak.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

TABLE_PATH = Path(__file__).with_name("device_peaks.yaml")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
DTYPE_PRECISION = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass(frozen=True)
class DevicePeaks:
    """One product row: the names that match it, dense peaks in FLOP/s per precision, and their source."""

    product: str
    names: tuple[str, ...]
    peaks: dict[str, float]
    source: str
    note: str = ""
    sparse_halved: bool = False


@dataclass(frozen=True)
class Peak:
    """The datasheet peak a result is judged against, or ``reason`` why there is none (then ``flops_per_s`` is None)."""

    flops_per_s: float | None
    precision: str
    product: str = ""
    source: str = ""
    halved: bool = False  # the source prints the with-sparsity figure; this is its dense half
    reason: str = ""

    def describe(self) -> str:
        if self.flops_per_s is None:
            return self.reason
        how = " (the datasheet's with-sparsity figure, halved)" if self.halved else ""
        return f"{self.product}: {self.flops_per_s / 1e12:,.1f} TFLOP/s dense {self.precision}{how}, {self.source}"


class PeakTableError(ValueError):
    """The peak table file is malformed; the message names the file, the row and the key."""


def _normal(name: str) -> str:
    return " ".join(name.split()).casefold()


def parse_table(data: object, path: Path | str = TABLE_PATH) -> tuple[DevicePeaks, ...]:
    """Rows of a peak table (``{"devices": [...]}``); a bad row is one error naming ``path``, the row and the key."""
    if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
        raise PeakTableError(f"{path}: expected a mapping with a `devices` list")
    rows = []
    seen: dict[str, str] = {}
    for i, row in enumerate(data["devices"]):
        where = f"{path}: devices[{i}]"
        if not isinstance(row, dict):
            raise PeakTableError(f"{where}: expected a mapping")
        unknown = set(row) - {"product", "names", "source", "note", "peaks", "sparse_halved"}
        if unknown:
            raise PeakTableError(f"{where}: unknown key(s) {sorted(unknown)}; valid: product, names, source, note, peaks, sparse_halved")
        for key in ("product", "names", "source", "peaks"):
            if not row.get(key):
                raise PeakTableError(f"{where}: `{key}` is missing (every peak needs its product, device names and source)")
        names = row["names"]
        if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
            raise PeakTableError(f"{where}: `names` must be a list of device-name strings")
        peaks = row["peaks"]
        if not isinstance(peaks, dict):
            raise PeakTableError(f"{where}: `peaks` must map a precision ({', '.join(PRECISIONS)}) to TFLOP/s")
        for precision, value in peaks.items():
            if precision not in PRECISIONS:
                raise PeakTableError(f"{where}: peaks.{precision}: unknown precision; valid: {', '.join(PRECISIONS)}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise PeakTableError(f"{where}: peaks.{precision}: expected a positive number of TFLOP/s, got {value!r}")
        for name in names:
            if _normal(name) in seen:
                raise PeakTableError(f"{where}: device name {name!r} is already matched by {seen[_normal(name)]!r}")
            seen[_normal(name)] = row["product"]
        rows.append(DevicePeaks(
            product=str(row["product"]), names=tuple(names), source=str(row["source"]), note=str(row.get("note", "")),
            sparse_halved=bool(row.get("sparse_halved", False)),
            peaks={p: float(v) * 1e12 for p, v in peaks.items()},
        ))
    return tuple(rows)


@lru_cache(maxsize=None)
def load_table(path: Path | str = TABLE_PATH) -> tuple[DevicePeaks, ...]:
    with open(path, encoding="utf-8") as fh:
        return parse_table(yaml.safe_load(fh), path)


def precision_for(dtype: str, float32_matmul_precision: str = "highest") -> str:
    """The peak column a step in ``dtype`` runs its matmuls at: float32 is plain FP32 at torch's default
    ``highest`` matmul precision, TF32 tensor cores at ``high`` or ``medium``."""
    if dtype not in DTYPE_PRECISION:
        raise ValueError(f"dtype {dtype!r}: no peak column; valid: {', '.join(DTYPE_PRECISION)}")
    precision = DTYPE_PRECISION[dtype]
    if precision == "fp32" and float32_matmul_precision in ("high", "medium"):
        return "tf32"
    return precision


def lookup(device_type: str, device_name: str, precision: str, table: tuple[DevicePeaks, ...] | None = None) -> Peak:
    """The dense datasheet peak of ``device_name`` at ``precision`` (a :class:`Peak`), or a refusal with the reason:
    a CPU, a name not in the table, or a precision the product's datasheet does not give."""
    if device_type != "cuda":
        return Peak(None, precision, reason=(
            f"no datasheet peak on a {device_type.upper()}: CPU datasheet peaks are not comparable; "
            "only the measured matmul roofline is used"))
    rows = load_table() if table is None else table
    wanted = _normal(device_name)
    row = next((r for r in rows if wanted in {_normal(n) for n in r.names}), None)
    if row is None:
        return Peak(None, precision, reason=(
            f"device {device_name!r} is not in the datasheet peak table ({TABLE_PATH.name}); MFU against a "
            "datasheet is not guessed from a similar name: add a row with the vendor's dense figure and its source"))
    if precision not in row.peaks:
        return Peak(None, precision, product=row.product, source=row.source, reason=(
            f"{row.product}: its datasheet gives no dense {precision} peak ({', '.join(sorted(row.peaks))} only)"))
    return Peak(row.peaks[precision], precision, product=row.product, source=row.source,
                halved=row.sparse_halved and precision != "fp32")
