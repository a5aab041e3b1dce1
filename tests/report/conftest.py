"""Fixtures for report tests: a synthetic run where every report section has data."""

from __future__ import annotations

import pytest
import report_synthetic

from pytest_flashckpt.core.result import RunRecord


@pytest.fixture
def record() -> RunRecord:
    return report_synthetic.record(comparison_=report_synthetic.comparison())
