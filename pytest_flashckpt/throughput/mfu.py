"""A scenario's throughput: tokens/s, achieved model and hardware FLOP/s, MFU and HFU, against both peaks.

The field's definitions (PaLM, appendix B; torchtitan logs the same every step):

- **model FLOPs** (useful work): the FLOPs of the step *without* recomputation, here the counted step of the
  scenario's reference (same model, kernel, batch and sequence, no activation checkpointing);
- **hardware FLOPs**: the FLOPs the step really executes, recomputation included (the scenario's own count);
- **MFU** = model FLOPs / step time / peak; **HFU** = hardware FLOPs / step time / peak.

Recomputation adds hardware FLOPs and time but no model FLOPs, so MFU falls as recompute rises while HFU need not;
without recomputation the two are equal. Both are given against the datasheet peak (``mfu``, ``hfu``; absent with
``mfu_absent`` saying why) and against the measured matmul roofline (``mfu_roofline``, ``hfu_roofline``).
A strategy's MFU over its reference's is 1 / overhead (the model FLOPs are the same), already gated as ``overhead``;
nothing here is gated.
"""

from __future__ import annotations

from pytest_flashckpt.throughput.peaks import Peak
from pytest_flashckpt.throughput.roofline import Roofline


def throughput_metrics(
    tokens_per_step: int, step_time_s: float, model_flops: int, hardware_flops: int,
    peak: Peak | None, roofline: Roofline | None, reference_step_time_s: float | None = None,
) -> dict[str, float | int | str]:
    """The vocabulary's throughput metrics (``pytest_flashckpt.core.metrics``) of one step of ``tokens_per_step`` tokens
    taking ``step_time_s`` (median), with ``model_flops`` useful and ``hardware_flops`` executed FLOPs.

    With ``reference_step_time_s`` (the reference's median over the same interleaved rounds) the reference's MFU
    from those rounds is given too (``reference_mfu``, ``reference_mfu_roofline``): on a machine whose load drifts
    during a run, a strategy's MFU is read against that, not against a reference timed minutes earlier."""
    if step_time_s <= 0:
        raise ValueError(f"step time must be positive, got {step_time_s}")
    if hardware_flops < model_flops:
        raise ValueError(f"hardware FLOPs {hardware_flops} < model FLOPs {model_flops}: the reference must be the no-recompute step")
    model_rate, hardware_rate = model_flops / step_time_s, hardware_flops / step_time_s
    out: dict[str, float | int | str] = {
        "tokens_per_s": tokens_per_step / step_time_s,
        "model_step_flops": model_flops,
        "hardware_step_flops": hardware_flops,
        "model_flops_per_s": model_rate,
        "hardware_flops_per_s": hardware_rate,
    }
    reference_rate = model_flops / reference_step_time_s if reference_step_time_s else None
    if peak is not None and peak.flops_per_s:
        out.update(mfu=model_rate / peak.flops_per_s, hfu=hardware_rate / peak.flops_per_s,
                   peak_flops_per_s=peak.flops_per_s, peak_source=peak.describe())
        if reference_rate is not None:
            out["reference_mfu"] = reference_rate / peak.flops_per_s
    elif peak is not None:
        out["mfu_absent"] = peak.reason
    if roofline is not None:
        m, k, n = roofline.best_shape
        out.update(roofline_flops_per_s=roofline.flops_per_s, roofline_shape=f"{m}x{k}x{n} {roofline.dtype}",
                   mfu_roofline=model_rate / roofline.flops_per_s, hfu_roofline=hardware_rate / roofline.flops_per_s)
        if reference_rate is not None:
            out["reference_mfu_roofline"] = reference_rate / roofline.flops_per_s
    return out
