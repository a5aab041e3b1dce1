"""A scenario's peak is the same whether it runs alone or after other scenarios in the same run (whose trainers
stay alive as references): on the CPU with the exact cpu probe, and on CUDA with the cuda probe."""

from __future__ import annotations

import pytest
import torch

from pytest_flashckpt.config.scenario import ActivationConfig, Scenario
from pytest_flashckpt.runner.context import RunContext, resolve_device
from pytest_flashckpt.runner.run import run_scenario


def scenario(name: str, strategy: str, dtype: str, seq_len: int) -> Scenario:
    return Scenario(name=name, suite="iso", model="tiny", attention="auto", dtype=dtype, batch_size=1, seq_len=seq_len,
                    activation=ActivationConfig(strategy=strategy), measure=("memory",), rounds=1, warmup=1)


def peaks_alone_and_in_suite(device: torch.device, probe: str, dtype: str):
    target = scenario("target", "full", dtype, 128)
    alone = run_scenario(target, RunContext(device=device, probe=probe))
    ctx = RunContext(device=device, probe=probe)
    for earlier in (scenario("a", "every_k", dtype, 96), scenario("b", "selective_op", dtype, 64)):
        assert run_scenario(earlier, ctx).status == "measured"
    in_suite = run_scenario(target, ctx)
    assert alone.status == in_suite.status == "measured", (alone.reason, in_suite.reason)
    return alone.metrics, in_suite.metrics


@pytest.mark.slow
def test_cpu_peak_alone_equals_peak_in_a_suite():
    alone, in_suite = peaks_alone_and_in_suite(torch.device("cpu"), "cpu", "float32")
    for key in ("peak_bytes", "state_bytes", "reference_peak_bytes"):
        assert alone[key] == in_suite[key], key


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; this machine has none")
def test_cuda_peak_alone_equals_peak_in_a_suite():
    alone, in_suite = peaks_alone_and_in_suite(resolve_device("auto"), "cuda", "bfloat16")
    for key in ("peak_bytes", "state_bytes", "reference_peak_bytes"):
        assert alone[key] == in_suite[key], key
    assert in_suite["cuda_other_live_bytes"] > alone["cuda_other_live_bytes"]  # others were alive, not counted
