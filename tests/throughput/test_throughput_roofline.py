"""The measured matmul roofline: timed arithmetic with an injected clock, a real (small, fast) CPU measurement, the
shapes taken from the step's own GEMMs."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch

from pytest_flashckpt.activation.expected_flops import expected_matmul_flops
from pytest_flashckpt.activation.flops import measure_step_flops
from pytest_flashckpt.models import GPTConfig, build_model
from pytest_flashckpt.throughput import roofline


def test_the_rate_is_the_best_batch_of_calls_over_the_injected_clock():
    ticks = itertools.count()
    clock = lambda: next(ticks) * 1e-3  # noqa: E731  every reading 1 ms after the previous one
    # the single timed call reads 1 ms, so a batch is ceil(2 ms / 1 ms) = 2 calls; each batch reads 1 ms: 0.5 ms a call
    r = roofline.measure_roofline("cpu", torch.float32, ((8, 4, 2), (16, 4, 2)), repeats=2, clock=clock)
    assert r.rates == pytest.approx({(8, 4, 2): 2 * 8 * 4 * 2 / 5e-4, (16, 4, 2): 2 * 16 * 4 * 2 / 5e-4}, rel=1e-9)
    assert r.best_shape == (16, 4, 2) and r.flops_per_s == r.rates[(16, 4, 2)]


def test_a_real_cpu_roofline_is_positive_and_its_best_shape():
    shapes = ((64, 64, 64), (128, 64, 32))
    r = roofline.measure_roofline("cpu", torch.float32, shapes, repeats=2, target_s=1e-4)
    assert set(r.rates) == set(shapes) and all(v > 0 for v in r.rates.values())
    assert r.flops_per_s == max(r.rates.values()) and r.dtype == "float32" and r.device == "cpu"
    assert "FLOP/s at" in r.describe()


def test_it_is_measured_once_per_cache_device_dtype_and_shapes():
    cache: dict = {}
    first = roofline.cached(cache, "cpu", torch.float32, ((16, 16, 16),), repeats=1, target_s=1e-5)
    assert roofline.cached(cache, "cpu", torch.float32, ((16, 16, 16),)) is first
    other = roofline.cached(cache, "cpu", torch.float64, ((16, 16, 16),), repeats=1, target_s=1e-5)
    assert other is not first and len(cache) == 2


def test_no_shapes_is_an_error():
    with pytest.raises(ValueError, match="no GEMM shapes"):
        roofline.measure_roofline("cpu", torch.float32, ())


def test_the_shapes_are_those_carrying_the_most_flops():
    flops = Counter({(1, 1, 1): 5, (2, 2, 2): 50, (3, 3, 3): 50, (4, 4, 4): 10})
    assert roofline.roofline_shapes(flops, limit=2) == ((2, 2, 2), (3, 3, 3))


def test_the_step_records_its_gemm_shapes_and_they_carry_every_linear_flop():
    config = GPTConfig(vocab_size=128, block_size=64, n_layer=2, n_head=2, n_embd=32)
    B, T, C = 2, 32, 32
    step = measure_step_flops(build_model(config, "sdpa"), B, T)
    # everything but the attention kernel is a Linear: forward, input gradient and weight gradient are mm/addmm
    attention = config.n_layer * (4 * B * T * T * C) * (1 + 5 / 2)
    assert sum(step.gemm_shapes.values()) == expected_matmul_flops(config, B, T) - attention
    assert (B * T, C, 3 * C) in step.gemm_shapes  # c_attn forward: tokens x width -> 3 x width
