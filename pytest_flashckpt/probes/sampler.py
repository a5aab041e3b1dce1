"""A background thread that polls a reading function and keeps the maximum: the shared engine of the
sampled probes (nvml, rss). A sampled peak is a lower bound: a spike shorter than the interval can be missed."""

from __future__ import annotations

import threading
from typing import Callable


class PeakSampler:
    def __init__(self, read: Callable[[], int], interval_s: float = 0.001) -> None:
        self._read = read
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flashckpt-sampler", daemon=True)
        self._error: BaseException | None = None
        self.first = read()
        self.peak = self.first
        self.last = self.first
        self.samples = 1

    def _run(self) -> None:
        try:
            while not self._stop.wait(self._interval_s):
                self._take()
        except BaseException as exc:  # surfaced by stop(), never swallowed
            self._error = exc

    def _take(self) -> None:
        value = self._read()
        self.last = value
        self.samples += 1
        if value > self.peak:
            self.peak = value

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"memory sampler failed: {self._error}") from self._error
        self._take()  # one last reading after the region
