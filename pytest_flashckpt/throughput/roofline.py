"""The measured matmul roofline: the best GEMM FLOP/s this device reaches at a step's own matmul sizes and dtype.

A datasheet peak says what the silicon can do under ideal conditions; the roofline says what a plain ``torch.mm``
reaches here, now, at the shapes the training step actually runs (the ``(M, K, N)`` of its Linears, forward and
backward, recorded while its FLOPs are counted: ``activation.flops.StepFlops.gemm_shapes``). "Achieved /
roofline" therefore separates "the step wastes time outside its matmuls" (pointwise ops, recomputation, the
optimizer, launch gaps) from "these matmuls are too small for this device", which "achieved / datasheet" mixes.
On a CPU it is the only peak used (datasheet CPU peaks are not comparable: see ``throughput.peaks``).

Each shape is timed after one untimed call, in batches of calls long enough to hide the clock and launch overhead
(``target_s``), best of ``repeats`` batches; the roofline is the best shape's rate. It is measured once per run for
each device, dtype and shape set (``cached``), and under a load it reads low, never high: a best-of estimate of a
ceiling. Timing on a GPU brackets the calls with ``torch.cuda.synchronize``.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch

from pytest_flashckpt.core.numbers import flops_rate

Shape = tuple[int, int, int]


@dataclass(frozen=True)
class Roofline:
    """``flops_per_s``: the best rate reached, at ``best_shape``; ``rates``: FLOP/s per timed shape."""

    flops_per_s: float
    best_shape: Shape
    dtype: str
    device: str
    rates: dict[Shape, float]
    seconds: float  # wall time of the measurement

    def describe(self) -> str:
        m, k, n = self.best_shape
        return (f"{flops_rate(self.flops_per_s)} at {m}x{k}x{n} ({self.dtype}, best of {len(self.rates)} GEMM shapes "
                f"of the step, measured in {self.seconds:.2f} s)")


def roofline_shapes(gemm_flops: Counter, limit: int = 6) -> tuple[Shape, ...]:
    """The ``limit`` GEMM shapes carrying the most FLOPs in a step (ties by shape, so the choice is deterministic)."""
    ranked = sorted(gemm_flops.items(), key=lambda item: (-item[1], item[0]))
    return tuple(sorted(shape for shape, _ in ranked[:limit]))


def _sync(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def measure_roofline(
    device: torch.device | str, dtype: torch.dtype, shapes: tuple[Shape, ...], repeats: int = 3,
    target_s: float = 2e-3, max_calls: int = 200, clock: Callable[[], float] = time.perf_counter,
) -> Roofline:
    """Time ``torch.mm`` of every ``(M, K, N)`` in ``shapes`` on ``device`` in ``dtype``; see the module docstring."""
    if not shapes:
        raise ValueError("measure_roofline: no GEMM shapes to time (the step ran no mm/addmm)")
    device = torch.device(device)
    sync = _sync(device)
    began = clock()
    rates: dict[Shape, float] = {}
    generator = torch.Generator(device="cpu").manual_seed(0)
    for m, k, n in shapes:
        a = torch.randn(m, k, generator=generator).to(device=device, dtype=dtype)
        b = torch.randn(k, n, generator=generator).to(device=device, dtype=dtype)
        out = torch.empty(m, n, device=device, dtype=dtype)
        torch.mm(a, b, out=out)  # untimed: kernel selection, first-touch of out
        sync()
        start = clock()
        torch.mm(a, b, out=out)
        sync()
        once = max(clock() - start, 1e-9)
        calls = max(1, min(max_calls, math.ceil(target_s / once)))
        best = once
        for _ in range(repeats):
            start = clock()
            for _ in range(calls):
                torch.mm(a, b, out=out)
            sync()
            best = min(best, (clock() - start) / calls)
        rates[(m, k, n)] = 2 * m * k * n / max(best, 1e-12)
    best_shape = max(rates, key=lambda s: rates[s])
    return Roofline(rates[best_shape], best_shape, str(dtype).removeprefix("torch."), str(device), rates, clock() - began)


def cached(cache: dict, device: torch.device | str, dtype: torch.dtype, shapes: tuple[Shape, ...], **kwargs) -> Roofline:
    """:func:`measure_roofline` once per ``cache`` (a run's cache) for each device, dtype and shape set."""
    key = f"roofline:{device}:{dtype}:{shapes}"
    if key not in cache:
        cache[key] = measure_roofline(device, dtype, shapes, **kwargs)
    return cache[key]
