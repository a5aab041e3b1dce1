"""MFU vs HFU from the FLOP split: model FLOPs are the no-recompute step's, hardware FLOPs the step's own."""

from __future__ import annotations

import pytest

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.activation.flops import measure_step_flops
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.models import GPTConfig, build_model
from pytest_flashckpt.throughput import peaks
from pytest_flashckpt.throughput.mfu import throughput_metrics
from pytest_flashckpt.throughput.roofline import Roofline

FAKE_PEAK = peaks.Peak(1e12, "fp32", product="Fake GPU", source="https://example.invalid/fake.pdf")
ROOF = Roofline(5e11, (64, 32, 96), "float32", "cpu", {(64, 32, 96): 5e11}, 0.01)
CONFIG = GPTConfig(vocab_size=128, block_size=64, n_layer=4, n_head=2, n_embd=32)


def counted(strategy: str) -> int:
    model = build_model(CONFIG, "sdpa")
    apply_ac(model, ActivationConfig(strategy=strategy, k=2))
    return measure_step_flops(model, 2, 32).matmul_flops


def test_full_recompute_has_hfu_above_mfu_and_none_has_them_equal():
    none, full = counted("none"), counted("full")
    plain = throughput_metrics(64, 0.5, none, none, FAKE_PEAK, ROOF)
    recomputed = throughput_metrics(64, 0.5, none, full, FAKE_PEAK, ROOF)
    assert plain["hfu"] == plain["mfu"] and plain["hfu_roofline"] == plain["mfu_roofline"]
    assert recomputed["hfu"] > recomputed["mfu"] == plain["mfu"]  # same useful work in the same time
    assert recomputed["hfu"] / recomputed["mfu"] == pytest.approx(full / none)  # the FLOP ratio, exactly


def test_the_numbers_are_rates_over_the_step_time_and_the_peaks():
    m = throughput_metrics(1024, 2.0, 4_000, 5_000, FAKE_PEAK, ROOF)
    assert m["tokens_per_s"] == 512 and m["model_flops_per_s"] == 2_000 and m["hardware_flops_per_s"] == 2_500
    assert m["mfu"] == 2_000 / 1e12 and m["hfu_roofline"] == 2_500 / 5e11
    assert m["roofline_shape"] == "64x32x96 float32" and "Fake GPU" in str(m["peak_source"])


def test_without_a_datasheet_peak_mfu_is_absent_with_the_reason_and_the_roofline_remains():
    m = throughput_metrics(64, 1.0, 100, 100, peaks.lookup("cuda", "NVIDIA A10G", "bf16"), ROOF)
    assert "mfu" not in m and "hfu" not in m and "'NVIDIA A10G'" in str(m["mfu_absent"])
    assert m["mfu_roofline"] == 100 / 5e11


def test_hardware_flops_below_model_flops_is_an_error():
    with pytest.raises(ValueError, match="no-recompute step"):
        throughput_metrics(64, 1.0, 200, 100, None, None)


def test_flash_attn_ops_get_sdpas_formulas_on_their_own_layout():
    from pytest_flashckpt.activation import flops

    B, T, H, D = 2, 64, 4, 16
    assert flops._flash_attn_forward((B, T, H, D), (B, T, H, D), (B, T, H, D)) == 4 * B * H * T * T * D
    assert flops._flash_attn_backward(*[(B, T, H, D)] * 4, None, None) == 10 * B * H * T * T * D  # scores recomputed
    assert all("flash" in str(op) for op in flops.flash_attn_formulas())  # none here unless flash-attn is imported


def test_the_references_mfu_from_the_same_rounds_puts_the_strategy_at_one_over_its_overhead():
    m = throughput_metrics(64, 1.25, 1_000, 1_210, FAKE_PEAK, ROOF, reference_step_time_s=1.0)
    assert m["reference_mfu"] == 1_000 / 1e12 and m["reference_mfu_roofline"] == 1_000 / 5e11
    assert m["mfu"] / m["reference_mfu"] == pytest.approx(1 / 1.25)  # the gated overhead, seen as MFU
    assert "reference_mfu" not in throughput_metrics(64, 1.0, 1, 1, FAKE_PEAK, ROOF)  # a reference has none
