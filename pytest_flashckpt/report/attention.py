"""Attention backends vs sequence length: the eager kernel materialises the s x s score matrix (O(N^2) memory),
the flash kernels do not (O(N)). Our peak is the whole training step's, so it is set beside FlashAttention's
published attention-only ratios with the reason the two differ."""

from __future__ import annotations

from pytest_flashckpt.core.claims import FLASH_ACTIVATION_QUOTE, FLASH_ACTIVATION_SUMMARY, FLASH_ATTENTION_MEMORY
from pytest_flashckpt.report import select
from pytest_flashckpt.report.format import MISSING, mib, ms, pct, ratio
from pytest_flashckpt.report.select import FLASH_BACKENDS, AttentionPoint
from pytest_flashckpt.report.tables import Footnotes, table

WHY_SMALLER = (
    "FlashAttention's published ratios (10x less memory at 2K tokens, 20x at 4K) are for the attention operation "
    "alone. Our peak is the whole training step: parameters, gradients and optimizer state (the `state` part, "
    "identical for every kernel) and the MLP, layer-norm and embedding activations are not attention and do not "
    "shrink, so the whole-step ratio is smaller and grows with sequence length as the s x s matrix comes to "
    "dominate. The \"activations\" ratio subtracts the state alive before the step and is the closer comparison."
)


def _published(seq_len: int) -> str:
    for ref in FLASH_ATTENTION_MEMORY:
        if ref.seq_len == seq_len:
            return f"{ref.ratio:.0f}x (attention only)"
    return MISSING


def _peak_cell(point: AttentionPoint, backend: str, notes: Footnotes) -> str:
    r = point.by_backend.get(backend)
    if r is None:
        return "not in this suite"
    if r.status != "measured":
        return notes.skipped(r.status, r.reason)
    peak = point.peak(backend)
    return f"{mib(peak)} (`{r.kernel}`)" if backend != "eager" else mib(peak)


def _ratio_cell(point: AttentionPoint, flash: str) -> str:
    eager, other = point.peak("eager"), point.peak(flash)
    if eager is None or other is None:
        return MISSING
    text = f"{ratio(eager / other)} step"
    acts_eager, acts_flash = point.activations("eager"), point.activations(flash)
    if acts_eager is not None and acts_flash:
        text += f", {ratio(acts_eager / acts_flash)} activations"
    return text


def _activation_savings(points: list[AttentionPoint], flash_backends: list[str]) -> list[str]:
    """The article's "50-70% less activation memory" beside ours, per sequence length."""
    found = []
    for p in points:
        for b in flash_backends:
            eager, flash = p.activations("eager"), p.activations(b)
            if eager and flash is not None:
                found.append(f"{pct(1 - flash / eager)} at seq {p.seq_len} (`{b}`)")
    if not found:
        return []
    return [
        "",
        f"The article: \"{FLASH_ACTIVATION_QUOTE}\" ({FLASH_ACTIVATION_SUMMARY}). "
        f"Measured activation-memory saving of a flash kernel over eager: {', '.join(found)}.",
    ]


def attention_section(results: list) -> list[str]:
    lines = ["## Attention backends vs sequence length", ""]
    points = select.attention_points(results)
    backends = select.attention_backends(points)
    flash = [b for b in backends if b in FLASH_BACKENDS]
    if not points or "eager" not in backends or not flash:
        missing = "no reference-configuration scenario was run" if not points else (
            f"only {', '.join(backends)} ran; an eager vs flash comparison needs both"
        )
        lines.append(f"_No attention-kernel comparison in this run: {missing}._")
        return lines
    notes = Footnotes()
    headers = ["model", "batch", "seq", *(f"{b} peak" for b in backends), *(f"eager / {b}" for b in flash), "published", f"step time ({' / '.join(['eager', *flash])})"]
    rows = []
    for p in points:
        times = []
        for b in ["eager", *flash]:
            r = p.by_backend.get(b)
            t = r.number("step_time_s") if r is not None and r.status == "measured" else None
            times.append(ms(t) if t is not None else MISSING)
        rows.append([
            p.card, str(p.batch_size), str(p.seq_len),
            *(_peak_cell(p, b, notes) for b in backends),
            *(_ratio_cell(p, b) for b in flash),
            _published(p.seq_len),
            " / ".join(times),
        ])
    lines += [table(rows, headers), *notes.lines(), "", WHY_SMALLER, *_activation_savings(points, flash)]
    return lines
