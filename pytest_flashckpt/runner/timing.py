"""Step timing, interleaved with the reference: A B A B ... so slow drifts (thermal, other tenants, caches)
hit both sides alike and their ratio stays honest. Absolute times are recorded, ratios are what we judge."""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch


def time_steps(step: Callable[[], object], steps: int, device: torch.device) -> float:
    """Mean wall time of ``steps`` calls of ``step``; synchronised with CUDA events on a GPU. The events are
    created and recorded with ``device`` current (``cuda:1`` must not be timed on the streams of ``cuda:0``)."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            start.record()
            for _ in range(steps):
                step()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000.0 / steps
    begin = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - begin) / steps


def interleaved(
    variants: Sequence[Callable[[], object]], rounds: int, steps: int, device: torch.device,
    on_round: Callable[[int, int], None] | None = None, first_round: int = 0,
) -> list[list[float]]:
    """Per-variant lists of per-round mean step times; each round runs every variant once, alternating which
    goes first (A B, B A, A B, ...) so neither side always runs right after the other. ``on_round(i, n)`` is
    called before each round (progress lines). ``first_round``: the number of rounds already run, so that rounds
    added later (confirmation rounds, ``runner.passes.timing_pass``) go on with the alternation."""
    samples: list[list[float]] = [[] for _ in variants]
    order = list(range(len(variants)))
    for r in range(first_round, first_round + rounds):
        if on_round is not None:
            on_round(r + 1, first_round + rounds)
        for i in order if r % 2 == 0 else reversed(order):
            samples[i].append(time_steps(variants[i], steps, device))
    return samples

