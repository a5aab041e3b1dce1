"""Throughput: how close each timed scenario is to the machine's limit. Tokens/s, achieved model and hardware
FLOP/s, MFU and HFU against the device's dense datasheet peak (with its source, or the reason there is none) and
against the matmul roofline measured in the same run, beside the FLOP ratio, the overhead and the peak memory.

A datasheet is never guessed: on a CPU, or on a GPU missing from ``throughput/device_peaks.yaml``, the datasheet
columns are absent and the reason is printed; the measured roofline is then the only peak (``header_lines``)."""

from __future__ import annotations

from pytest_flashckpt.report import select
from pytest_flashckpt.report.format import MISSING, metric, mib, pct, ratio
from pytest_flashckpt.report.tables import Footnotes, escape, table
from pytest_flashckpt.core.result import Result, RunRecord

HEADERS = [
    "scenario", "strategy", "kernel", "dtype", "tokens/s", "model FLOP/s", "hardware FLOP/s", "FLOP ratio",
    "overhead", "MFU", "HFU", "reference MFU", "roofline", "MFU / roofline", "HFU / roofline",
    "reference MFU / roofline", "peak memory",
]


def throughput_results(results: list[Result]) -> list[Result]:
    """Scenarios that time a step (``timing`` in ``measure``), measured or not; simulated ones are predictions."""
    return [r for r in results if "timing" in r.config.measure and not select.simulated(r)]


def plotted(results: list[Result]) -> list[Result]:
    """Measured results with an MFU (datasheet or roofline) and a peak memory: the MFU vs memory plot's points."""
    return [r for r in throughput_results(results) if select.measured(r) and mfu_of(r)[0] is not None
            and r.number("peak_bytes") is not None]


def mfu_of(r: Result) -> tuple[float | None, float | None, str]:
    """(MFU, HFU, against what): the datasheet's when the run had one, else the measured roofline's."""
    if r.number("mfu") is not None:
        return r.number("mfu"), r.number("hfu"), "datasheet peak"
    return r.number("mfu_roofline"), r.number("hfu_roofline"), "measured matmul roofline"


def header_lines(record: RunRecord) -> list[str]:
    """What MFU is judged against in this run, one line per dtype: the datasheet peak with its source (a GPU), or
    the reason there is none; and each matmul roofline measured (one per workload's GEMM shapes)."""
    datasheet: dict[str, str] = {}
    rooflines: dict[str, list[str]] = {}
    for r in record.results:
        if not select.measured(r) or r.number("model_flops_per_s") is None:
            continue
        dtype = r.config.dtype
        datasheet.setdefault(dtype, str(r.metrics.get("peak_source") or f"none: {r.metrics.get('mfu_absent') or 'not recorded'}"))
        roof = r.number("roofline_flops_per_s")
        if roof is not None:
            text = f"{metric('roofline_flops_per_s', roof)} at {r.metrics.get('roofline_shape', '?')}"
            if text not in rooflines.setdefault(dtype, []):
                rooflines[dtype].append(text)
    if not datasheet:
        return []
    cpu = record.profile.get("device_type") == "cpu"
    head = ("- **peak FLOP/s** (CPU: the measured matmul roofline only; CPU datasheet peaks are not comparable):"
            if cpu else "- **peak FLOP/s** (dense datasheet peak per dtype, and the measured matmul roofline):")
    lines = [head]
    for dtype in sorted(datasheet):
        roofs = "; ".join(rooflines.get(dtype, [])) or "not measured"
        peak = "" if cpu else f"datasheet {datasheet[dtype]}; "
        lines.append(f"  - `{dtype}`: {escape(peak)}measured matmul roofline (best `torch.mm` at the step's GEMM shapes) {roofs}")
    return lines


def _row(r: Result, notes: Footnotes) -> list[str]:
    head = [f"`{r.id}`", select.describe_activation(r)]
    if r.status != "measured":
        return [*head, notes.skipped(r.status, r.reason), *[MISSING] * (len(HEADERS) - 3)]
    mfu, hfu = r.number("mfu"), r.number("hfu")
    absent = r.metrics.get("mfu_absent")
    datasheet = ([pct(mfu), pct(hfu), pct(r.number("reference_mfu"))] if mfu is not None
                 else [f"{MISSING} {notes.mark(str(absent))}" if absent else MISSING] * 3)
    return [
        *head, f"`{r.kernel}`" if r.kernel else MISSING, r.config.dtype,
        metric("tokens_per_s", r.number("tokens_per_s")), metric("model_flops_per_s", r.number("model_flops_per_s")),
        metric("hardware_flops_per_s", r.number("hardware_flops_per_s")),
        ratio(r.number("hardware_step_flops") / r.number("model_step_flops")) if r.number("model_step_flops") else MISSING,
        ratio(r.number("overhead")), *datasheet, metric("roofline_flops_per_s", r.number("roofline_flops_per_s")),
        pct(r.number("mfu_roofline")), pct(r.number("hfu_roofline")),
        pct(r.number("reference_mfu_roofline")), mib(r.number("peak_bytes")),
    ]


def throughput_section(results: list[Result]) -> list[str]:
    lines = ["## Throughput: MFU and HFU", ""]
    chosen = throughput_results(results)
    if not chosen:
        lines.append("_No scenario timed a training step (`timing` in `measure`) in this suite._")
        return lines
    notes = Footnotes()
    rows = [_row(r, notes) for r in chosen]
    lines += [
        table(rows, HEADERS),
        *notes.lines(),
        "",
        "Model FLOPs = the counted FLOPs of the reference's step (no recomputation: the useful work); hardware FLOPs "
        "= this step's own count (recomputation included); both / the median step time (forward, backward and "
        "optimizer step). MFU / HFU = those rates over the device's dense datasheet peak for the dtype (source in "
        "the header); MFU / roofline and HFU / roofline over the best `torch.mm` rate measured in this run at the "
        "step's own GEMM shapes. Reference MFU = the reference's, from its step times in the same interleaved rounds "
        "(read a strategy's MFU against it: absolute rates move with the machine's load, ratios of neighbours "
        "do not). FLOP ratio = hardware / model FLOPs. Recomputation adds hardware FLOPs but no "
        "model FLOPs, so MFU falls as recompute rises while HFU need not; a strategy's MFU over its reference's "
        "is 1 / overhead (gated as the overhead). FLOPs are matmul and attention FLOPs (torch's FlopCounterMode); "
        "pointwise ops are not counted. Scenarios without a timing pass (checkpoint-only) have no step time and are "
        "not listed.",
    ]
    return lines
