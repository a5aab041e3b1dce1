"""The fit's arithmetic: the device table, the time model's formulas, Young's interval, the checkpoint's bytes."""

from __future__ import annotations

import dataclasses
import math

import pytest

from pytest_flashckpt.activation.expected_flops import expected_matmul_flops
from pytest_flashckpt.config.errors import InputError
from pytest_flashckpt.config.model_card import load_card
from pytest_flashckpt.fit.candidates import SAVED_BYTES_PER_PARAM, Candidate
from pytest_flashckpt.fit.checkpoint_cost import (LLAMA3_GPU_HOURS_PER_INTERRUPTION, checkpoint_cost, job_mtbf_hours,
                                                  lost_fraction, young_interval_s)
from pytest_flashckpt.fit.hardware import DEVICES, choose_device, load_hardware_file
from pytest_flashckpt.fit.time_model import StepTimeModel, pipeline_bubble_fraction, replay_counts, ring_s, tp_collectives
from pytest_flashckpt.throughput.peaks import lookup

CARD = load_card("llama-tiny")
H100 = DEVICES["h100-sxm"]


def test_every_device_row_has_sources_and_its_flops_are_the_datasheet_tables() -> None:
    for device in DEVICES.values():
        assert device.sources and all(device.sources)
        assert device.peak_flops == lookup("cuda", device.product, "bf16").flops_per_s
        assert device.nvlink_bytes_per_s > device.network_bytes_per_s > 0
    assert H100.link_bytes_per_s(8) == H100.nvlink_bytes_per_s and H100.link_bytes_per_s(16) == H100.network_bytes_per_s


def test_devices_are_overridden_from_the_command_line_and_from_a_yaml_file(tmp_path) -> None:
    assert choose_device("h100-sxm", nvlink_gbps=100.0, peak_tflops=None).nvlink_bytes_per_s == 100e9
    path = tmp_path / "hw.yaml"
    path.write_text("h100-sxm: {network_bytes_per_s: 1.0e+10}\n", encoding="utf-8")
    assert load_hardware_file(path)["h100-sxm"].network_bytes_per_s == 1e10
    with pytest.raises(InputError, match="unknown device; valid: a100-sxm, h100-sxm, h200-sxm"):
        choose_device("tpu-v5")
    path.write_text("h100-sxm: {nvlink: 3}\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"hw.yaml: device 'h100-sxm': unknown field 'nvlink'"):
        load_hardware_file(path)
    path.write_text("b300: {peak_flops: 1.0e+15}\n", encoding="utf-8")
    with pytest.raises(InputError, match="new device 'b300' lacks product"):
        load_hardware_file(path)


def test_ring_and_bubble_formulas() -> None:
    assert ring_s(8e9, 1, 1e9) == 0.0
    assert ring_s(8e9, 4, 1e9) == pytest.approx(6.0)  # (4-1)/4 of 8 GB at 1 GB/s
    assert ring_s(0, 4, 1e9, hop_latency_s=1e-6, base_latency_s=2e-6, calls=3) == pytest.approx(3 * (2e-6 + 3 * 1e-6))
    assert H100.hop_latency_s(8) < H100.hop_latency_s(16)  # NVLink hop, then a network hop
    assert pipeline_bubble_fraction(1, 8) == 0.0
    assert pipeline_bubble_fraction(4, 8) == pytest.approx(3 / 8)
    assert pipeline_bubble_fraction(4, 8, virtual_stages=2) == pytest.approx(3 / 16)
    assert tp_collectives(n_blocks=3, replays=0, selective_replays=0) == 3 * 8 + 4
    assert tp_collectives(n_blocks=3, replays=3, selective_replays=0) == 3 * 12 + 4


def test_replays_are_read_off_each_strategys_plan() -> None:
    def counts(strategy: str, k: int = 2) -> tuple[int, int]:
        return replay_counts(Candidate(gpus=2, dp_shard=1, tp=2, microbatch=1, accumulation=1, strategy=strategy,
                                       precision="mixed", k=k), 5)

    assert counts("none") == (0, 0) and counts("full") == (5, 0) and counts("selective_op") == (0, 5)
    assert counts("every_k", k=2) == (3, 0) and counts("every_k", k=3) == (2, 0)  # blocks 0, 2, 4 / 0, 3


def test_compute_is_the_closed_form_flops_over_tp_at_peak_times_mfu() -> None:
    model = StepTimeModel(CARD, 128, H100, mfu=0.25)
    c = Candidate(gpus=4, dp_shard=2, tp=2, microbatch=3, accumulation=2, strategy="full", precision="mixed")
    t = model.step(c)
    flops = expected_matmul_flops(CARD, 3, 128, "full")
    assert t.compute_s == pytest.approx(2 * flops / 2 / (H100.peak_flops * 0.25))
    assert t.model_flops == expected_matmul_flops(CARD, 3 * 2 * 2, 128, "none")  # no recomputation in MFU
    assert t.tp_s > 0 and t.tokens_per_s_per_gpu == pytest.approx(2 * 3 * 2 * 128 / t.step_s / 4)
    alone = model.step(Candidate(gpus=1, dp_shard=1, tp=1, microbatch=3, accumulation=2, strategy="full", precision="mixed"))
    assert alone.tp_s == alone.fsdp_s == 0.0


def test_fsdp_is_exposed_only_beyond_compute_and_reshard_after_forward_gathers_twice() -> None:
    slow_links = choose_device("h100-sxm", nvlink_gbps=0.001, network_gbps=0.001)
    model = StepTimeModel(CARD, 128, slow_links)
    c = Candidate(gpus=2, dp_shard=2, tp=1, microbatch=1, accumulation=1, strategy="none", precision="mixed")
    t = model.step(c)
    assert t.fsdp_exposed_s == pytest.approx(t.fsdp_s - t.compute_s) and t.fsdp_exposed_s > 0
    once = model.step(Candidate(**{**vars(c), "reshard_after_forward": False}))
    assert once.fsdp_s < t.fsdp_s
    no_latency = dataclasses.replace(choose_device("h100-sxm", nvlink_gbps=1e9), collective_latency_s=0.0,
                                     nvlink_hop_latency_s=0.0)
    fast = StepTimeModel(CARD, 128, no_latency).step(c)
    assert fast.fsdp_exposed_s == 0.0  # hidden under compute


def test_young_interval_minimises_the_expected_lost_work() -> None:
    save, mtbf = 60.0, 6 * 3600.0
    tau = young_interval_s(save, mtbf)
    assert tau == pytest.approx(math.sqrt(2 * 60 * 6 * 3600))
    best = lost_fraction(save, tau, mtbf)
    assert best < lost_fraction(save, tau * 0.8, mtbf) and best < lost_fraction(save, tau * 1.25, mtbf)
    assert job_mtbf_hours(1024) == pytest.approx(LLAMA3_GPU_HOURS_PER_INTERRUPTION / 1024)
    assert job_mtbf_hours(1024, 5.0) == 5.0


def test_checkpoint_bytes_per_rank_split_over_shards_and_replicas() -> None:
    params = CARD.num_params()
    fsdp = Candidate(gpus=8, dp_shard=8, tp=1, microbatch=1, accumulation=1, strategy="none", precision="mixed")
    hsdp = Candidate(**{**vars(fsdp), "dp_shard": 4, "dp_replicate": 2})
    one = checkpoint_cost(params, fsdp, 8, storage_gbps=1.0, mtbf_hours=10.0)
    assert one.bytes_per_rank == -(-params // 8) * SAVED_BYTES_PER_PARAM["mixed"] and one.files_per_rank == 1
    assert one.staging_bytes_per_node == 8 * one.bytes_per_rank
    assert one.save_s == pytest.approx(one.staging_bytes_per_node / 1e9)
    assert one.interval_s == pytest.approx(math.sqrt(2 * one.save_s * 36000))
    two = checkpoint_cost(params, hsdp, 8, storage_gbps=1.0, mtbf_hours=10.0)
    assert two.bytes_per_rank == pytest.approx(one.bytes_per_rank, rel=1e-3)  # a replica writes half of twice as much
    assert checkpoint_cost(params, fsdp, 8, state_bytes=1000).bytes_per_rank == 1000  # the simulated state wins
