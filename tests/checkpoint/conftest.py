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
