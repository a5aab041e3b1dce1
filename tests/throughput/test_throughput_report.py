"""The throughput section, its plot, the header's peak lines, the terminal line and the checkpoint I/O fractions,
from synthetic results (round, made-up numbers)."""

from __future__ import annotations

from pathlib import Path

from pytest_flashckpt.checkpoint.bandwidth import against_limits
from pytest_flashckpt.config.scenario import ActivationConfig, Scenario
from pytest_flashckpt.report.markdown import render
from pytest_flashckpt.report.plots import write_plots
from pytest_flashckpt.report.terminal import scenario_line
from pytest_flashckpt.report.throughput import HEADERS, header_lines, throughput_section
from pytest_flashckpt.core.result import Result, RunRecord
from pytest_flashckpt.throughput.mfu import throughput_metrics
from pytest_flashckpt.throughput.peaks import Peak, lookup
from pytest_flashckpt.throughput.roofline import Roofline

ROOF = Roofline(100e9, (2048, 256, 1024), "float32", "cpu", {(2048, 256, 1024): 100e9}, 0.5)
MODEL = 10_000_000_000  # FLOPs of the reference step


def result(strategy: str, overhead: float, flop_ratio: float, peak_mib: int, datasheet: Peak | None,
           status: str = "measured") -> Result:
    scenario = Scenario(name=f"{strategy}-s512", suite="synthetic", attention="sdpa", seq_len=512,
                        activation=ActivationConfig(strategy), measure=("memory", "timing", "flops"))
    metrics = {"peak_bytes": peak_mib * 2**20, "overhead": overhead, "step_time_s": overhead}
    metrics.update(throughput_metrics(2048, overhead, MODEL, int(MODEL * flop_ratio), datasheet, ROOF))
    return Result("synthetic", scenario.name, status, scenario, reason=None if status == "measured" else "no GPU",
                  backend="sdpa", kernel="sdpa-flash-cpu", probe="cpu", metrics=metrics if status == "measured" else {})


def record(datasheet: Peak | None, device_type: str = "cpu") -> RunRecord:
    results = [result("none", 1.0, 1.0, 100, datasheet), result("full", 1.25, 1.21, 40, datasheet),
               result("selective_op", 1.05, 1.02, 75, datasheet), result("offload", 1.0, 1.0, 0, datasheet, status="skipped")]
    return RunRecord(profile={"device_type": device_type, "device_name": "x"}, profile_id="p", created="now", commit=None,
                     suite="synthetic", device=device_type, probe="cpu", results=results)


def test_the_section_has_the_columns_and_mfu_falls_with_recompute_while_hfu_does_not():
    cpu = lookup("cpu", "cpu", "fp32")
    lines = throughput_section(record(cpu).results)
    text = "\n".join(lines)
    assert all(h in lines[2] for h in HEADERS)
    none_row = next(line for line in lines if "`synthetic::none-s512`" in line)
    full_row = next(line for line in lines if "`synthetic::full-s512`" in line)
    # MFU / roofline and HFU / roofline: none 10 GFLOP/s of 100 -> 10.0% both; full: 8.0% MFU, 9.7% HFU
    assert "| 10.0%" in none_row and none_row.count("10.0%") == 2
    assert "8.0%" in full_row and "9.7%" in full_row and "1.21x" in full_row
    assert "no datasheet peak on a CPU" in text  # the datasheet columns' footnote says why they are empty
    assert "skipped [" in text  # the offload row, with its reason


def test_with_a_datasheet_peak_the_mfu_columns_and_the_header_name_its_source():
    fake = Peak(1e12, "fp32", product="Fake GPU", source="https://example.invalid/fake.pdf")
    rec = record(fake, device_type="cuda")
    full_row = next(line for line in throughput_section(rec.results) if "full-s512" in line)
    assert "0.8%" in full_row and "1.0%" in full_row  # 8 GFLOP/s and 9.68 GFLOP/s of 1 TFLOP/s
    head = "\n".join(header_lines(rec))
    assert "dense datasheet peak" in head and "https://example.invalid/fake.pdf" in head


def test_on_a_cpu_the_header_says_the_roofline_is_the_only_peak():
    head = header_lines(record(lookup("cpu", "cpu", "fp32")))
    assert "CPU: the measured matmul roofline only" in head[0]
    assert "100.0 GFLOP/s" in head[1]
    assert "peak FLOP/s" in render(record(lookup("cpu", "cpu", "fp32")))


def test_the_plot_is_drawn_and_placed_in_the_report(tmp_path: Path):
    rec = record(lookup("cpu", "cpu", "fp32"))
    plots = write_plots(rec, tmp_path)
    assert plots["throughput"].file is not None and (tmp_path / plots["throughput"].file).stat().st_size > 0
    assert f"]({plots['throughput'].file})" in render(rec, plots)
    empty = RunRecord(profile={}, profile_id="p", created="now", commit=None, suite="synthetic", device="cpu", probe="cpu",
                      results=[])
    assert "not drawn" in write_plots(empty, tmp_path)["throughput"].markdown()


def test_the_terminal_line_stays_one_line_with_mfu():
    r = record(lookup("cpu", "cpu", "fp32")).results[1]
    line = scenario_line(r, "ok")
    assert "\n" not in line and "MFU 8.0% of roofline (HFU 9.7%)" in line
    assert "MFU" not in scenario_line(r, "ok", compact=True)


def test_the_staging_copy_is_stated_against_the_measured_memory_copy():
    out = against_limits({"snapshot_bytes": 2e9, "snapshot_copy_s": 0.5, "copy_GBps": 8.0})
    assert out == {"staging_GBps": 4.0, "staging_vs_copy": 0.5}
    assert against_limits({"snapshot_bytes": 2e9, "copy_GBps": 8.0}) == {}  # a blocking save: no staging copy
