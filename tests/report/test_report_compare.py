"""``compare_markdown``: two runs side by side."""

from __future__ import annotations

import copy

import report_synthetic as syn

from pytest_flashckpt.report import compare_markdown


def test_compare_rows_and_changes() -> None:
    a = syn.record()
    b = copy.deepcopy(a)
    medium_b = next(r for r in b.results if r.scenario == "medium-s512")
    medium_b.metrics["peak_bytes"] = medium_b.metrics["peak_bytes"] * 2  # type: ignore[operator]
    medium_b.metrics["memory_saving"] = 0.60
    text = compare_markdown(a, b, "a.json", "b.json")
    assert "`a.json`" in text and "`b.json`" in text
    row = [line for line in text.splitlines() if "`synthetic::medium-s512`" in line and "| peak_bytes" in line][0]
    assert "+100.0%" in row and "45.0 MiB" in row and "90.0 MiB" in row
    saving = [line for line in text.splitlines() if "`synthetic::medium-s512`" in line and "memory_saving" in line][0]
    assert "+5.0 pp" in saving
    assert "Profiles differ" not in text
    assert "| quick prototype" in text and "verdict in B" in text


def test_compare_lists_scenarios_not_in_both_and_profile_mismatch() -> None:
    a = syn.record()
    b = syn.record(syn.results()[:2])
    b.profile_id = "other"
    text = compare_markdown(a, b, metrics=("peak_bytes",))
    assert "Profiles differ" in text
    assert "`synthetic::gc`" in text and "not in this run" in text
    assert "skipped: SYNTHETIC-SKIP offload" in text
