"""The metric vocabulary is the one list: every metric is written through it (an unknown name is refused where it is
written), gated ones are judged, budgets bound what the fixture measures."""

from __future__ import annotations

import copy
import json
import pickle
from dataclasses import fields
from pathlib import Path

import pytest

from pytest_flashckpt.baselines.regression_verdicts import metric_kind
from pytest_flashckpt.core import metrics
from pytest_flashckpt.core.metrics import Measurements, UnknownMetric
from pytest_flashckpt.core.result import Result
from pytest_flashckpt.plugin.measurement import Measurement
from pytest_flashckpt.plugin.marker_budgets import SPECS, violations
from pytest_flashckpt.runner.passes import SavePass, TimingPass
from pytest_flashckpt.config.record_file import record_from_dict
from pytest_flashckpt.config.scenario import Scenario

ROOT = Path(__file__).resolve().parents[1]


def test_a_name_outside_the_vocabulary_is_refused_where_it_is_written():
    """Every write (``record``, ``absorb``, ``metrics[...] =``, ``update``, samples) names the key, the closest rows
    and where to add one; nothing reaches results.json under an unknown name."""
    result = Result("s", "a", "measured", Scenario("a"))
    with pytest.raises(UnknownMetric, match=r"'peak_byte' is not a metric of the vocabulary \(did you mean peak_bytes") as info:
        result.record("peak_byte", 1)
    assert "pytest_flashckpt/core/metrics.py" in str(info.value) and "step_flops" in str(info.value)  # the valid ones
    for write in (lambda: result.metrics.__setitem__("stall_s", 1.0), lambda: result.metrics.update(total_s=1.0),
                  lambda: result.metrics.setdefault("bytes", 1), lambda: result.samples.__setitem__("save_stall_s_samples", [1.0]),
                  lambda: Measurements().record("staged_bytes", 1)):
        with pytest.raises(UnknownMetric):
            write()
    assert result.metrics == {} and result.samples == {}
    result.record("save_stall_s", 0.2, samples=[0.1, 0.2, 0.3])
    assert result.metrics == {"save_stall_s": 0.2} and result.samples == {"save_stall_s": [0.1, 0.2, 0.3]}


def test_the_runners_passes_write_vocabulary_names_with_samples_under_the_metrics_name():
    """The producers of runner.passes, run on fixed numbers: a key they add outside the vocabulary fails here (and in
    every test that runs them) at once, not when a committed sample is next regenerated."""
    timing = TimingPass([0.2, 0.3, 0.25], [0.1, 0.1, 0.1]).measurements()
    assert set(timing) == {"step_time_s", "reference_step_time_s", "overhead", "overhead_min", "overhead_max"}
    assert timing.samples["overhead"] == pytest.approx([2.0, 3.0, 2.5]) and timing["overhead"] == pytest.approx(2.5)
    saves = SavePass([0.1, 0.3], [0.2, 0.4]).measurements()
    assert dict(saves.samples) == {"save_stall_s": [0.1, 0.3], "save_total_s": [0.2, 0.4]}
    result = Result("s", "a", "measured", Scenario("a"))
    result.absorb(timing)
    result.absorb(saves)
    assert set(result.samples) <= set(result.metrics) <= set(metrics.METRICS)


def test_a_file_written_before_one_sample_convention_loads_into_it():
    """A results.json written before (tests/data/results-old-shape.json, schema 1) keeps per-save samples as
    ``<metric>_samples``: read under the metric's name (by the one upgrade function, config.upgrade)."""
    record = json.loads((ROOT / "tests" / "data" / "results-old-shape.json").read_text(encoding="utf-8"))
    stored = next(r for r in record["results"] if r["scenario"] == "save-async")
    assert "save_stall_s_samples" in stored["samples"]  # the old convention, as committed
    def read(result: dict) -> Result:  # one result of the schema-1 file, through the upgrade (config.upgrade)
        return record_from_dict({**record, "results": [result]}).results[0]

    loaded = read(stored)
    assert loaded.samples["save_stall_s"] == stored["samples"]["save_stall_s_samples"]
    assert not any(name.endswith("_samples") for name in loaded.samples) and loaded.per_rank == {}
    old = read({**stored, "samples": {"peak_bytes_per_rank": [1, 2], "overhead": [1.0]}})
    assert old.per_rank == {"peak_bytes": [1, 2]} and old.samples == {"overhead": [1.0]}
    removed = read({**stored, "metrics": {"a_metric_removed_since": 1}})  # read as it was written
    assert copy.deepcopy(removed).metrics == {"a_metric_removed_since": 1}
    assert pickle.loads(pickle.dumps(removed)).metrics == {"a_metric_removed_since": 1}


def test_gated_metrics_have_a_judgement():
    for name in metrics.GATED:
        assert metric_kind(name, "cpu") in ("exact", "memory", "ratio", "time")
    assert metric_kind("peak_bytes", "cpu") == "exact" and metric_kind("peak_bytes", "nvml") == "memory"
    assert metric_kind("memory_saving", "cpu") is None  # recorded, never gated


@pytest.mark.parametrize("key", sorted(SPECS))
def test_each_budget_bounds_what_the_fixture_measures_in_the_direction_its_key_names(key):
    """Independent of the table the budgets are built from: the key's ``max_``/``min_`` says the direction, the
    fixture's ``Measurement`` must have the metric, and the marker's check must flag a value past the limit on
    that side and pass one inside it."""
    spec = SPECS[key]
    assert key.startswith(("max_", "min_")), f"{key}: a budget is a max_ or a min_"
    assert spec.metric in {f.name for f in fields(Measurement)}, f"{key}: the fixture never measures {spec.metric}"
    limit = 0.5
    worse, better = (0.75, 0.25) if key.startswith("max_") else (0.25, 0.75)
    assert violations({key: limit}, [{"name": "m", spec.metric: better}]) == []
    broken = violations({key: limit}, [{"name": "m", spec.metric: worse}])
    assert len(broken) == 1 and broken[0].startswith(f"{key}: m {spec.metric} = ")
    assert [line for line in violations({key: limit}, [{"name": "m"}]) if f"has no {spec.metric}" in line]


def test_formatting_reads_the_table():
    assert metrics.format_metric("peak_bytes", 3 * 2**20) == "3.0 MiB"
    assert metrics.format_metric("stall_vs_sync", 0.25) == "25.0%"
    assert metrics.format_metric("overhead", 1.234) == "1.23x"
    assert metrics.format_metric("some_probe_extra_bytes", 2**20) == "1.0 MiB"  # outside the table: by suffix


def test_the_vocabulary_keeps_labels_apart_from_numbers_and_answers_the_default_lists():
    """Texts are Label rows (never gated, budgeted or compared); the default lists are read off the rows."""
    assert {"strategy", "format", "budget_plan", "peak_source"} <= set(metrics.LABELS)
    assert all(row.unit == "text" for row in metrics.LABELS.values())
    assert all(row.unit != "text" for row in metrics.NUMBERS.values())
    assert metrics.METRICS == {**metrics.NUMBERS, **metrics.LABELS}
    assert not set(metrics.LABELS) & (set(metrics.GATED) | set(metrics.COMPARED) | set(metrics.FOLLOWED))
    assert metrics.COMPARED[:2] == ("peak_bytes", "memory_saving") and metrics.FOLLOWED[0] == "overhead"
    assert all(metrics.METRICS[name].per_save for name in metrics.PER_SAVE) and "load_s" not in metrics.PER_SAVE
    with pytest.raises(TypeError, match="'strategy' is text"):
        metrics.Label("strategy", "text", "info", "x", gated=True)
    with pytest.raises(TypeError, match="a text is a Label row"):
        metrics.Metric("strategy", "text", "info", "x")


def test_a_label_takes_a_text_and_a_number_does_not():
    measured = Measurements()
    measured.record("strategy", "async")
    measured.record("peak_bytes", None)  # not measurable here
    with pytest.raises(TypeError, match="'strategy' is a label"):
        measured.record("strategy", 3)
    with pytest.raises(TypeError, match="'peak_bytes' is a number"):
        measured.record("peak_bytes", "1 GiB")
    assert dict(measured) == {"strategy": "async", "peak_bytes": None}
