"""Memory probes: ``cpu`` (exact live-tensor accounting), ``cuda`` (allocator peak), ``nvml`` (device memory
sampled through nvidia-ml-py, a lower bound) and ``rss`` (process resident set, sanity only).

Every probe is used the same way::

    probe = make_probe("cpu")
    with probe.track(resident=trainer.state_tensors()) as reading:
        trainer.train_step()
    reading.peak_bytes
"""

from pytest_flashckpt.probes.base import PROBE_NAMES, PROBES, MemoryReading, default_probe_name, make_probe

__all__ = ["MemoryReading", "PROBE_NAMES", "PROBES", "default_probe_name", "make_probe"]
