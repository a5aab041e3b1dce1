"""GPU twins of the throughput tests: the roofline on the device, the real device name against the peak table, the
FLOP split of a CUDA step. Skipped with the reason where there is no CUDA device."""

from __future__ import annotations

import pytest
import torch

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.activation.flops import measure_step_flops
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.models import GPTConfig, build_model
from pytest_flashckpt.throughput import peaks, roofline
from pytest_flashckpt.throughput.mfu import throughput_metrics

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; this machine has none"),
]


def test_the_cuda_roofline_never_beats_the_datasheet():
    """The MFU-above-100% pitfall: a measured bf16 GEMM rate above the table's dense peak means a wrong row."""
    r = roofline.measure_roofline("cuda", torch.bfloat16, ((4096, 4096, 4096), (8192, 1024, 4096)))
    assert r.flops_per_s > 0 and r.device.startswith("cuda")
    peak = peaks.lookup("cuda", torch.cuda.get_device_name(), "bf16")
    if peak.flops_per_s is not None:
        assert r.flops_per_s <= 1.05 * peak.flops_per_s, (r.describe(), peak.describe())


def test_the_real_device_name_is_matched_or_refused_with_the_reason():
    name = torch.cuda.get_device_name()
    peak = peaks.lookup("cuda", name, "bf16")
    assert (peak.flops_per_s is not None and peak.source.startswith("https://")) or repr(name) in peak.reason or "no dense" in peak.reason


def test_the_flop_split_on_cuda_full_recompute_hfu_above_mfu():
    config = GPTConfig(vocab_size=128, block_size=128, n_layer=3, n_head=2, n_embd=64)
    counts = {}
    for strategy in ("none", "full"):
        model = build_model(config, "sdpa", "cuda", torch.bfloat16)
        apply_ac(model, ActivationConfig(strategy=strategy))
        counts[strategy] = measure_step_flops(model, 2, 64)
    assert counts["none"].gemm_shapes and counts["full"].matmul_flops > counts["none"].matmul_flops
    peak = peaks.Peak(1e12, "bf16", product="any", source="https://example.invalid")
    m = throughput_metrics(128, 0.01, counts["none"].matmul_flops, counts["full"].matmul_flops, peak, None)
    assert m["hfu"] > m["mfu"]
