"""The GPU suite loads and passes preflight here, covers what it promises, and is what ``--flashckpt-suite`` with no
value picks on a CUDA device; the profile's kernel is resolved with the dtype the run uses."""

from __future__ import annotations

import pytest
import torch

from pytest_flashckpt.config.suites import AUTO_SUITE, default_suite_for, load_suite
from pytest_flashckpt.models import attention
from pytest_flashckpt.models.cards import load_card
from pytest_flashckpt.runner.profile import run_kernel
from pytest_flashckpt.config.preflight import preflight


def test_gpu_suite_loads_and_passes_preflight():
    suite = load_suite("gpu")
    for scenario in suite.scenarios:
        preflight(scenario)
    assert {s.dtype for s in suite.scenarios} == {"bfloat16"}


def test_gpu_suite_covers_kernels_strategies_and_sizes():
    scenarios = load_suite("gpu").scenarios
    kernels = {(s.attention, s.card, s.seq_len) for s in scenarios if s.measure == ("memory", "timing")}
    for card in ("gpt2-small-16k", "gpt3-125m-16k"):
        for seq in (2048, 4096, 8192, 16384):
            assert ("flash_attn", card, seq) in kernels and ("sdpa", card, seq) in kernels
        assert {("eager", card, 2048), ("eager", card, 4096)} <= kernels
    assert {s.activation.strategy for s in scenarios} == {"none", "full", "every_k", "selective_op", "offload"}
    assert {s.save.strategy for s in scenarios} >= {"sync", "async", "dcp", "selective", "layerwise", "scheduled"}
    large = next(s for s in scenarios if s.article == "large")
    assert (large.card, large.seq_len, large.activation.strategy) == ("gpt3-2.7b", 2048, "full")
    for card in ("gpt2-small-16k", "gpt3-125m-16k"):  # same blocks as the published shapes
        long, short = load_card(card), load_card(card.removesuffix("-16k"))
        assert (long.n_layer, long.n_embd, long.n_head) == (short.n_layer, short.n_embd, short.n_head)


@pytest.mark.parametrize(("device", "suite"), [("cuda", "gpu"), ("cuda:1", "gpu"), ("cpu", "default")])
def test_default_suite_follows_the_device(device, suite):
    assert default_suite_for(device) == suite


def test_auto_device_picks_the_gpu_suite_when_cuda_is_present(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_suite_for("auto") == "gpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_suite_for("auto") == "default"
    assert AUTO_SUITE == "auto"


def test_profile_kernel_is_resolved_with_the_runs_dtype(monkeypatch):
    """Models flash-attn's real rules on an sm90 GPU with the package installed: half precision only."""

    def reason(device, dtype):
        if device.type != "cuda":
            return "flash-attn runs on CUDA GPUs only"
        return None if dtype in (torch.float16, torch.bfloat16) else "flash-attn needs float16 or bfloat16"

    monkeypatch.setattr(attention, "flash_attn_unavailable_reason", reason)
    gpu = [s.dtype for s in load_suite("gpu").scenarios]
    assert run_kernel("cuda:0", gpu) == "flash_attn"
    assert run_kernel("cuda:0", ["float32", "float32", "bfloat16"]) == "sdpa"
    assert run_kernel("cuda:0", ["float32", "bfloat16"]) == "flash_attn"  # a tie goes to half precision
    assert run_kernel("cpu", gpu) == "sdpa"  # unchanged for every CPU profile


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; this machine has none")
def test_real_gpu_profile_runs_flash_attn_in_bf16():
    import importlib.util

    if importlib.util.find_spec("flash_attn") is None:
        pytest.skip("flash-attn is not installed")
    assert run_kernel("cuda:0", ["bfloat16"]) == "flash_attn"
    assert default_suite_for("auto") == "gpu"
