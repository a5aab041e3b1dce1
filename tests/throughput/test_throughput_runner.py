"""The runner's throughput step: the roofline is timed at the reference's GEMMs, so every strategy of a workload
shares one measurement; MFU uses the reference's count and HFU the scenario's own."""

from __future__ import annotations

from collections import Counter

import torch

from pytest_flashckpt.activation.flops import StepFlops
from pytest_flashckpt.config.scenario import ActivationConfig, Scenario
from pytest_flashckpt.runner.context import RunContext
from pytest_flashckpt.runner.run import _throughput


def test_strategies_of_one_workload_share_the_references_roofline_and_its_model_flops():
    ctx = RunContext(device=torch.device("cpu"), probe="cpu")
    scenario = Scenario(name="full", suite="t", activation=ActivationConfig("full"), batch_size=2, seq_len=16)
    ref = StepFlops(1_000, 0, Counter(), Counter({(32, 16, 16): 600, (32, 16, 48): 400}))
    recomputed = StepFlops(1_300, 0, Counter(), Counter({(32, 16, 48): 800, (32, 16, 16): 500, (8, 8, 8): 1}))
    first = _throughput(scenario, ctx, 0.5, 0.4, recomputed, ref)
    again = _throughput(scenario, ctx, 0.5, 0.4, ref, None)  # the reference itself: the same shapes, cached
    assert [k for k in ctx.cache if k.startswith("roofline:")] == ["roofline:cpu:torch.float32:((32, 16, 16), (32, 16, 48))"]
    assert first["roofline_flops_per_s"] == again["roofline_flops_per_s"]
    assert first["model_step_flops"] == 1_000 and first["hardware_step_flops"] == 1_300
    assert first["tokens_per_s"] == 32 / 0.5 and "no datasheet peak on a CPU" in first["mfu_absent"]
