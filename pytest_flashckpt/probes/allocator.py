"""The CPU allocator's own view of a region, read from ``torch.profiler`` memory events: the reference the exact
``cpu`` probe is checked against (it sees what no ``TorchDispatchMode`` sees: scratch inside one op, 0-dim tensors
made from Python scalars, tensors C++ makes outside the dispatcher such as ``torch.get_rng_state()`` and gloo's
collective buffers). Too slow and too noisy in what it records to measure with on every run: a check, not a probe.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch._C._profiler import _EventType


def _walk(nodes):
    for node in nodes:
        yield node
        yield from _walk(node.children)


def allocator_added_peak(step: Callable[[], object], device: str = "cpu") -> int:
    """Most bytes the allocator of ``device`` had handed out at once during ``step()``, minus what it had handed out
    when ``step`` began (from the running total every allocation event carries, in time order, on every thread)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted(
        (e for e in _walk(prof.profiler.kineto_results.experimental_event_tree())
         if e.tag == _EventType.Allocation and str(e.extra_fields.device) == device),
        key=lambda e: e.start_time_ns,
    )  # fmt: skip
    if not events:
        return 0
    first = events[0].extra_fields
    return max(e.extra_fields.total_allocated for e in events) - (first.total_allocated - first.alloc_size)
