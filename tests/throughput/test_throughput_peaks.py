"""The datasheet peak table: exact matches only, refusals with their reason, a fake row matched by a fake name."""

from __future__ import annotations

import pytest

from pytest_flashckpt.throughput import peaks

FAKE = {"devices": [{"product": "Fake GPU 9000", "names": ["FAKE-GPU 9000 80GB"], "source": "https://example.invalid/fake.pdf",
                     "peaks": {"bf16": 100, "fp32": 10}}]}


def test_the_shipped_table_loads_with_a_source_for_every_row_and_dense_numbers():
    rows = peaks.load_table()
    assert len(rows) >= 10
    for row in rows:
        assert row.source.startswith("https://"), row.product
        assert set(row.peaks) <= set(peaks.PRECISIONS)
        # dense tensor rates are at most 64x the FP32 rate on every product listed (2:4-sparse ones would double it)
        assert all(v <= 64 * row.peaks["fp32"] for v in row.peaks.values()), row.product


@pytest.mark.parametrize(("name", "precision", "tflops"), [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.5),  # SXM: the datasheet's 1,979 with sparsity, halved
    ("NVIDIA H100 PCIe", "bf16", 756.5),
    ("NVIDIA H200", "bf16", 989.5),
    ("NVIDIA A100-SXM4-80GB", "tf32", 156),
    ("NVIDIA A100 80GB PCIe", "fp32", 19.5),
    ("NVIDIA L40S", "fp16", 362.05),
    ("Tesla V100-SXM2-32GB", "fp16", 125),
    ("nvidia  h100 80gb hbm3", "bf16", 989.5),  # case and spacing aside, the same name
])
def test_known_names_match_their_row(name, precision, tflops):
    peak = peaks.lookup("cuda", name, precision)
    assert peak.flops_per_s == pytest.approx(tflops * 1e12)
    assert peak.source.startswith("https://") and peak.reason == ""


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA H100", "NVIDIA H800", "NVIDIA GeForce RTX 3090", ""])
def test_an_unknown_device_is_refused_with_its_name_never_matched_to_a_similar_one(name):
    peak = peaks.lookup("cuda", name, "bf16")
    assert peak.flops_per_s is None
    assert repr(name) in peak.reason and "not guessed" in peak.reason


def test_a_precision_the_datasheet_lacks_is_refused():
    peak = peaks.lookup("cuda", "Tesla V100-PCIE-16GB", "bf16")  # Volta: no bf16 tensor cores
    assert peak.flops_per_s is None and "no dense bf16 peak" in peak.reason


def test_a_cpu_has_no_datasheet_peak():
    peak = peaks.lookup("cpu", "cpu", "fp32")
    assert peak.flops_per_s is None and "roofline" in peak.reason


def test_a_fake_table_entry_is_matched_by_a_fake_device_name():
    table = peaks.parse_table(FAKE, "fake.yaml")
    peak = peaks.lookup("cuda", "fake-gpu  9000 80gb", "bf16", table)
    assert peak.flops_per_s == 100e12 and peak.product == "Fake GPU 9000"
    assert "Fake GPU 9000: 100.0 TFLOP/s dense bf16, https://example.invalid/fake.pdf" == peak.describe()
    assert peaks.lookup("cuda", "NVIDIA H100 80GB HBM3", "bf16", table).flops_per_s is None  # only that table


@pytest.mark.parametrize(("edit", "message"), [
    (lambda row: row.pop("source"), "devices[0]: `source` is missing"),
    (lambda row: row["peaks"].update(fp8=2000), "devices[0]: peaks.fp8: unknown precision"),
    (lambda row: row["peaks"].update(bf16="fast"), "devices[0]: peaks.bf16: expected a positive number"),
    (lambda row: row.update(sparse=True), "devices[0]: unknown key(s) ['sparse']"),
])
def test_a_malformed_table_names_the_file_row_and_key(edit, message):
    data = {"devices": [dict(FAKE["devices"][0], peaks=dict(FAKE["devices"][0]["peaks"]))]}
    edit(data["devices"][0])
    with pytest.raises(peaks.PeakTableError, match="fake.yaml") as info:
        peaks.parse_table(data, "fake.yaml")
    assert message in str(info.value)


def test_a_name_in_two_rows_is_an_error():
    row = FAKE["devices"][0]
    with pytest.raises(peaks.PeakTableError, match="already matched"):
        peaks.parse_table({"devices": [row, dict(row, product="Other")]}, "fake.yaml")


@pytest.mark.parametrize(("dtype", "matmul_precision", "column"), [
    ("float32", "highest", "fp32"), ("float32", "high", "tf32"), ("float32", "medium", "tf32"),
    ("bfloat16", "highest", "bf16"), ("float16", "high", "fp16"),
])
def test_the_peak_column_follows_dtype_and_torchs_float32_matmul_precision(dtype, matmul_precision, column):
    assert peaks.precision_for(dtype, matmul_precision) == column
