"""The metric vocabulary is the one list: every metric a run records is defined there, gated ones are judged."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_flashckpt.core import metrics
from pytest_flashckpt.baselines.regression_verdicts import metric_kind
from pytest_flashckpt.plugin.marker_budgets import SPECS

ROOT = Path(__file__).resolve().parents[1]


def test_every_recorded_metric_is_in_the_vocabulary():
    """The sample run committed with the repository (reports/sample/results.json): a producer that adds a metric without
    its row in pytest_flashckpt/core/metrics.py fails here."""
    record = json.loads((ROOT / "reports" / "sample" / "results.json").read_text(encoding="utf-8"))
    recorded = {name for r in record["results"] for name in r["metrics"]}
    assert recorded, "the sample results file has no metrics"
    assert recorded - set(metrics.METRICS) == set()


def test_gated_metrics_have_a_judgement_and_budgets_come_from_the_table():
    for name in metrics.GATED:
        assert metric_kind(name, "cpu") in ("exact", "memory", "ratio", "time")
    assert metric_kind("peak_bytes", "cpu") == "exact" and metric_kind("peak_bytes", "nvml") == "memory"
    assert metric_kind("memory_saving", "cpu") is None  # recorded, never gated
    assert {key: spec.metric for key, spec in SPECS.items()} == {key: m.name for key, m in metrics.BUDGETS.items()}


def test_formatting_reads_the_table():
    assert metrics.format_metric("peak_bytes", 3 * 2**20) == "3.0 MiB"
    assert metrics.format_metric("stall_vs_sync", 0.25) == "25.0%"
    assert metrics.format_metric("overhead", 1.234) == "1.23x"
    assert metrics.format_metric("some_probe_extra_bytes", 2**20) == "1.0 MiB"  # outside the table: by suffix
