"""CLI fixtures: a synthetic results file (built by tests/report/report_synthetic.py) on disk."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("report_synthetic", Path(__file__).parent.parent / "report" / "report_synthetic.py")
assert _SPEC is not None and _SPEC.loader is not None
synthetic = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(synthetic)


@pytest.fixture
def results_file(tmp_path: Path) -> Path:
    path = tmp_path / "run" / "results.json"
    # the attention scenarios only: one plot to draw keeps the CLI tests fast (plots are tested in tests/report)
    results = [r for r in synthetic.results() if r.config.activation.strategy == "none" and r.config.save.strategy == "none"]
    synthetic.record(results).write_json(path)
    return path
