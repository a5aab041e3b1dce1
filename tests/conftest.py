"""Shared test helpers. Hypothesis profiles: ``ci`` (default, fast) and ``deep``, chosen by the environment
variable FLASHCKPT_HYPOTHESIS_PROFILE."""

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("FLASHCKPT_HYPOTHESIS_PROFILE", "ci"))

pytest_plugins = ["pytester"]


@pytest.fixture
def one_thread():
    """Tiny models: one intra-op thread is faster and steadier on a shared 2-core machine (modules that want it say
    ``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
