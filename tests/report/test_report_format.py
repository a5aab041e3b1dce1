"""Numbers a person reads."""

from __future__ import annotations

from pytest_flashckpt.report.format import MISSING, change, metric, ms, spread


def test_units_by_metric_name() -> None:
    assert metric("peak_bytes", 3 * 2**20) == "3.0 MiB"
    assert metric("memory_saving", 0.256) == "25.6%"
    assert metric("overhead", 1.2345) == "1.23x"
    assert metric("save_stall_s", 0.0123) == "12.3 ms"
    assert metric("write_MBps", 1234.5) == "1,234 MB/s"
    assert metric("step_flops", 2.5e9) == "2.50 GFLOP"
    assert metric("strategy", "async") == "async"
    assert metric("whatever", 0.123456789) == "0.1235"
    assert metric("peak_bytes", None) == MISSING


def test_seconds_switch_units() -> None:
    assert ms(0.5) == "500.0 ms" and ms(12.345) == "12.35 s"


def test_spread_and_change() -> None:
    assert spread(1.2, 1.1, 1.3) == "1.20x (1.10-1.30)"
    assert spread(None, None, None) == MISSING
    assert change("peak_bytes", 100, 110) == "+10.0%"
    assert change("memory_saving", 0.30, 0.35) == "+5.0 pp"
    assert change("peak_bytes", None, 1) == MISSING
