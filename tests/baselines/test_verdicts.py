"""Verdict logic on synthetic samples (deterministic): exact counts, memory tolerance, timing ratios with a
tolerance AND a Mann-Whitney test, absolute times only on opt-in."""

import pytest

from pytest_flashckpt.baselines.regression_verdicts import Thresholds, compare_scenario, judge_sampled, underpowered
from pytest_flashckpt.options import OPTIONS

BASE = [1.20, 1.21, 1.19, 1.22, 1.20, 1.18, 1.21, 1.19, 1.20, 1.22]


def test_identical_samples_are_ok():
    row = judge_sampled("s::a", "overhead", BASE, BASE[:5], 0.05, 0.01)
    assert row["verdict"] == "ok" and row["change"] == pytest.approx(0.0)


def test_clear_shift_is_regressed_with_a_small_p():
    row = judge_sampled("s::a", "overhead", BASE, [1.40, 1.41, 1.39, 1.42, 1.38], 0.05, 0.01)
    assert row["verdict"] == "regressed"
    assert row["p_value"] == pytest.approx(1 / 3003)
    assert row["change"] == pytest.approx(1.40 / 1.20 - 1)


def test_clear_drop_is_improved():
    row = judge_sampled("s::a", "overhead", BASE, [1.00, 1.01, 0.99, 1.02, 1.00], 0.05, 0.01)
    assert row["verdict"] == "improved" and row["p_value"] < 0.01


def test_shift_within_tolerance_is_ok_even_when_significant():
    row = judge_sampled("s::a", "overhead", BASE, [1.24, 1.24, 1.25, 1.24, 1.25], 0.05, 0.01)
    assert row["p_value"] < 0.01 and row["verdict"] == "ok"


def test_breach_that_noise_explains_is_within_noise():
    noisy = [1.0, 1.6, 1.1, 1.5, 1.3]  # median +8%, but it overlaps the baseline
    row = judge_sampled("s::a", "overhead", BASE, noisy, 0.05, 0.01)
    assert row["verdict"] == "~" and row["p_value"] > 0.01


def test_two_rounds_cannot_be_significant_and_say_so():
    assert underpowered(2, 2, 0.01) and underpowered(10, 2, 0.01) and not underpowered(10, 3, 0.01)
    rows, notes = compare_scenario(
        "s::a", {"metrics": {"overhead": 1.0}, "samples": {"overhead": [1.0, 1.0]}, "probe": "cpu"},
        {"overhead": 2.0}, {"overhead": [2.0, 2.0]}, "cpu", Thresholds(),
    )
    assert rows[0]["verdict"] == "~"
    assert "cannot reach p < 0.01" in notes[0] and "smallest possible p = 0.167" in notes[0]


def _base(**metrics):
    return {"metrics": metrics, "samples": {"overhead": BASE, "step_time_s": [0.5] * 10}, "probe": "cpu"}


def test_exact_probe_bytes_are_compared_to_the_byte():
    rows, _ = compare_scenario("s::a", _base(peak_bytes=1000, step_flops=10), {"peak_bytes": 1001, "step_flops": 10}, {}, "cpu", Thresholds())
    verdicts = {r["metric"]: r["verdict"] for r in rows}
    assert verdicts == {"peak_bytes": "regressed", "step_flops": "ok"}
    rows, _ = compare_scenario("s::a", _base(peak_bytes=1000), {"peak_bytes": 999}, {}, "cpu", Thresholds())
    assert rows[0]["verdict"] == "improved"


def test_sampled_probe_memory_uses_the_memory_tolerance():
    base = {**_base(peak_bytes=1000), "probe": "rss"}
    rows, _ = compare_scenario("s::a", base, {"peak_bytes": 1015}, {}, "rss", Thresholds(memory_tolerance=0.02))
    assert rows[0]["verdict"] == "ok"
    rows, _ = compare_scenario("s::a", base, {"peak_bytes": 1030}, {}, "rss", Thresholds(memory_tolerance=0.02))
    assert rows[0]["verdict"] == "regressed" and rows[0]["p_value"] is None


def test_memory_from_another_probe_is_not_compared():
    rows, notes = compare_scenario("s::a", _base(peak_bytes=1000), {"peak_bytes": 5000}, {}, "rss", Thresholds())
    assert rows == [] and "baseline probe 'cpu', this run 'rss'" in notes[0]


def test_absolute_times_are_gated_only_on_opt_in():
    current = ({"step_time_s": 0.9}, {"step_time_s": [0.9] * 5})
    rows, _ = compare_scenario("s::a", _base(step_time_s=0.5), *current, "cpu", Thresholds())
    assert rows == []
    rows, _ = compare_scenario("s::a", _base(step_time_s=0.5), *current, "cpu", Thresholds(gate_times=True))
    assert rows[0]["metric"] == "step_time_s" and rows[0]["verdict"] == "regressed"


def test_stall_vs_sync_samples_are_rebuilt_from_per_save_stalls():
    base = {"metrics": {"stall_vs_sync": 0.1}, "samples": {"stall_vs_sync": [0.1] * 10}, "probe": "cpu"}
    metrics = {"stall_vs_sync": 0.5, "reference_save_total_s": 2.0}
    rows, _ = compare_scenario("s::a", base, metrics, {"save_stall_s": [1.0, 1.0, 1.0]}, "cpu", Thresholds())
    assert rows[0]["current"] == pytest.approx(0.5) and rows[0]["verdict"] == "regressed"


def test_threshold_defaults_match_the_option_defaults():
    defaults = {spec.name: spec.default for spec in OPTIONS}
    assert Thresholds().timing_tolerance == defaults["flashckpt-timing-tolerance"]
    assert Thresholds().memory_tolerance == defaults["flashckpt-memory-tolerance"]
    assert Thresholds().alpha == defaults["flashckpt-alpha"]


def test_bytes_written_has_a_tiny_slack_and_save_extra_memory_the_memory_tolerance():
    base = _base(bytes_written=150_000_000, save_extra_peak_bytes=1000)
    rows, _ = compare_scenario("s::a", base, {"bytes_written": 150_000_900, "save_extra_peak_bytes": 1010}, {}, "cpu", Thresholds())
    assert {r["metric"]: r["verdict"] for r in rows} == {"bytes_written": "ok", "save_extra_peak_bytes": "ok"}
    rows, _ = compare_scenario("s::a", base, {"bytes_written": 151_000_000}, {}, "cpu", Thresholds())
    assert rows[0]["verdict"] == "regressed"


def test_checkpoint_pass_sample_lists_are_found():
    base = {"metrics": {"stall_vs_sync": 0.1}, "samples": {"stall_vs_sync": [0.1] * 10}, "probe": "cpu"}
    metrics = {"stall_vs_sync": 0.5, "reference_save_total_s": 2.0}
    rows, _ = compare_scenario("s::a", base, metrics, {"save_stall_s_samples": [1.0, 1.0, 1.0]}, "cpu", Thresholds())
    assert rows[0]["verdict"] == "regressed"


def test_a_run_much_noisier_than_the_baseline_is_not_judged():
    quiet = [1.001, 0.999, 1.006, 1.008, 1.016, 0.989, 0.981, 0.997, 0.928, 0.972]  # gate-power baseline
    burst = [1.4, 1.204, 1.511]  # an unchanged step during a burst of other work: p = 1/286, +40%
    row = judge_sampled("s::a", "overhead", quiet, burst, 0.05, 0.01)
    assert row["p_value"] < 0.01 and row["verdict"] == "~"
    rows, notes = compare_scenario(
        "s::a", {"metrics": {"overhead": 1.0}, "samples": {"overhead": quiet}, "probe": "cpu"},
        {"overhead": 1.4}, {"overhead": burst}, "cpu", Thresholds(),
    )
    assert rows[0]["verdict"] == "~" and "too noisy to judge" in notes[0]
    slower = [1.131, 1.117, 1.107]  # a real 10% slowdown in a quiet run
    assert judge_sampled("s::a", "overhead", quiet, slower, 0.05, 0.01)["verdict"] == "regressed"
