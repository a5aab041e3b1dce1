"""Hypothesis profiles for the checkpoint proofs: ``ci`` (default; few examples, no deadline) and ``deep``, chosen
with the environment variable FLASHCKPT_HYPOTHESIS_PROFILE. Same values as tests/conftest.py registers, so running
the checkpoint tests alone or with the whole suite gives the same examples."""

from __future__ import annotations

import os

import pytest
import torch

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("deep", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.load_profile(os.environ.get("FLASHCKPT_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _one_thread():
    """The proof models are tiny: one intra-op thread is faster and steadier on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
