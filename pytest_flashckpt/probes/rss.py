"""The ``rss`` probe: the process's resident set, sampled from /proc/self/statm. A sanity check only: it
includes the allocator's cached pages, libraries and Python itself. Never ``ru_maxrss``, which is a
lifetime high-water mark that cannot be reset per step."""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

from pytest_flashckpt.core.files import resident_bytes
from pytest_flashckpt.probes.base import MemoryReading
from pytest_flashckpt.probes.sampler import PeakSampler



class RssProbe:
    name = "rss"

    def __init__(self, interval_s: float = 0.001) -> None:
        self.interval_s = interval_s

    @contextlib.contextmanager
    def track(self, resident: Iterable = ()) -> Iterator[MemoryReading]:
        sampler = PeakSampler(resident_bytes, self.interval_s)
        reading = MemoryReading(self.name, start_bytes=sampler.first, exact=False)
        try:
            with sampler:
                yield reading
        finally:
            reading.peak_bytes, reading.end_bytes = sampler.peak, sampler.last
            reading.extra["rss_samples"] = sampler.samples
