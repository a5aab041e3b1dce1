"""Hypothesis profiles for the checkpoint proofs: ``ci`` (default; few examples, no deadline) and ``deep``, chosen
with the environment variable FLASHCKPT_HYPOTHESIS_PROFILE. Same values as tests/conftest.py registers, so running
the checkpoint tests alone or with the whole suite gives the same examples."""

from __future__ import annotations

import os

import pytest

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("deep", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.load_profile(os.environ.get("FLASHCKPT_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """The proof models are tiny: every checkpoint test runs on one intra-op thread (tests/conftest.py)."""


@pytest.fixture
def small_bandwidth_probes(monkeypatch):
    """``run_checkpoint_pass`` times this machine's raw write and memory copy first (64 MB each by default: about
    0.2 s of CPU, 0.4 s of wall, per pass). Tests of what a pass returns run both real probes on 8 MB instead, the
    size ``test_bandwidth_probes`` checks them with: ``raw_write_MBps`` and ``copy_GBps`` are still measured."""
    import functools

    from pytest_flashckpt.checkpoint import bandwidth, measure

    monkeypatch.setattr(measure, "write_bandwidth_MBps", functools.partial(bandwidth.write_bandwidth_MBps, megabytes=8))
    monkeypatch.setattr(measure, "copy_bandwidth_GBps", functools.partial(bandwidth.copy_bandwidth_GBps, megabytes=8))
