"""Feed scenario step timings to pytest-benchmark, so ``--benchmark-json``, ``--benchmark-compare`` and
``--benchmark-histogram`` see flashckpt scenarios like any benchmarked test.

pytest-benchmark has no public API for pre-measured samples. Its ``benchmark`` fixture is a
``BenchmarkFixture`` whose ``_make_stats(iterations)`` registers a ``Metadata`` with the session (through the
``add_stats`` callback) and whose ``Metadata.update(duration)`` adds one round of ``iterations`` calls. We build
such a fixture for each scenario item exactly as pytest-benchmark's own fixture does and call those two. They are
private, so every step is guarded: if pytest-benchmark is absent, disabled, or its internals differ, the run
goes on and ``note`` says why timings were not forwarded. It never fails a test.
"""

from __future__ import annotations

from typing import Any

from pytest_flashckpt.core.result import Result


class BenchmarkBridge:
    def __init__(self, config: Any) -> None:
        self.session = getattr(config, "_benchmarksession", None)
        self.note: str | None = None
        if self.session is None:
            self.note = None  # pytest-benchmark not loaded (or -p no:benchmark): nothing to do, nothing to say
        elif getattr(self.session, "disabled", False) or getattr(self.session, "skip", False):
            self.session = None  # --benchmark-disable / --benchmark-skip: respect it

    def add(self, item: Any, result: Result) -> None:
        """One benchmark entry per measured scenario: rounds = per-round step times, extra_info = metrics."""
        times = result.samples.get("step_time_s")
        if self.session is None or result.status != "measured" or not times:
            return
        try:
            from pytest_benchmark.fixture import BenchmarkFixture

            fixture = BenchmarkFixture(
                item,
                add_stats=self.session.benchmarks.append,
                logger=self.session.logger,
                warner=lambda *args, **kwargs: None,
                disabled=False,
                **dict(self.session.options),
            )
            fixture.group = f"flashckpt:{result.suite}"
            fixture.extra_info.update(_extra_info(result))
            steps = result.config.steps
            stats = fixture._make_stats(steps)
            for seconds in times:
                stats.update(float(seconds) * steps)  # update() divides by iterations: per-step time is kept
        except Exception as exc:  # private internals: degrade, never crash the suite run
            self.note = f"step timings not forwarded ({type(exc).__name__}: {exc}); pytest-benchmark internals may have changed"
            self.session = None


def _extra_info(result: Result) -> dict[str, Any]:
    info: dict[str, Any] = {k: v for k, v in sorted(result.metrics.items()) if isinstance(v, (int, float, str)) or v is None}
    info.update({"kernel": result.kernel, "probe": result.probe, "device": result.device, "scenario": result.id})
    return info
