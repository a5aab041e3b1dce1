"""The runner's entry point, the bandwidth probes and the checkpoint suite file."""

from __future__ import annotations

import time

import pytest

from ckpt_helpers import make_trainer
from pytest_flashckpt.checkpoint import copy_bandwidth_GBps, measure, run_checkpoint_pass, write_bandwidth_MBps
from pytest_flashckpt.checkpoint.api import _config
from pytest_flashckpt.checkpoint.checkpointer import Checkpointer
from pytest_flashckpt.config.scenario import SaveConfig, Scenario
from pytest_flashckpt.config.suites import load_suite
from pytest_flashckpt.core.metrics import PER_SAVE


@pytest.mark.slow
@pytest.mark.parametrize(
    "config",
    [SaveConfig(strategy="sync", saves=2), SaveConfig(async_save=True, saves=2, max_keep=1), SaveConfig(layer_checkpoint_dir="l", saves=2)],
    ids=["sync", "async", "layerwise"],
)
@pytest.mark.usefixtures("small_bandwidth_probes")
def test_run_checkpoint_pass_returns_every_metric(config: SaveConfig, tmp_path) -> None:
    trainer = make_trainer()
    metrics = run_checkpoint_pass(trainer, config, tmp_path)
    for name in (*PER_SAVE, "load_s"):
        assert metrics[name] is not None and metrics[name] >= 0, name
    assert set(PER_SAVE) == {"save_stall_s", "save_total_s", "bytes_written", "write_MBps", "save_extra_peak_bytes", "files"}
    for name in PER_SAVE:
        assert len(metrics.samples[name]) == 2  # under the metric's own name, as every pass keeps its samples
    assert metrics["saves"] == 2 and metrics["verified"] == "bitwise" and metrics["steps"] == 2
    rounds = config.time_lost_rounds
    assert len(metrics.samples["time_lost_s"]) == len(metrics.samples["time_lost_plain_s"]) == rounds
    assert len(metrics.samples["time_lost_saving_s"]) == rounds and metrics["time_lost_saving_s"] > 0
    assert not any(name.endswith("_samples") for name in metrics.samples)
    assert metrics["time_lost_min_s"] <= metrics["time_lost_s"] <= metrics["time_lost_max_s"]
    assert metrics["time_lost_plain_s"] > 0 and metrics["time_lost_window_steps"] == config.save_interval
    assert metrics["raw_write_MBps"] > 0 and metrics["copy_GBps"] > 0
    assert metrics["bytes_written"] > metrics["snapshot_bytes"]
    if config.async_save:
        assert metrics["save_extra_peak_bytes"] >= metrics["snapshot_bytes"]  # the staging copy, counted exactly
        assert metrics["save_total_s"] >= metrics["save_stall_s"]
    else:
        assert metrics["save_stall_s"] >= metrics["save_total_s"]  # sync: training waits for the commit


def test_bandwidth_probes(tmp_path) -> None:
    assert write_bandwidth_MBps(tmp_path, megabytes=8) > 1
    assert copy_bandwidth_GBps(megabytes=8) > 0.1
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_suite_covers_every_save_strategy() -> None:
    suite = load_suite("checkpoint")
    strategies = {s.save.strategy for s in suite.scenarios}
    from pytest_flashckpt.core.registry import SAVE_PRESETS

    assert strategies == set(SAVE_PRESETS)
    # every save strategy runs on a card whose training state (model + AdamW) is at least 100 MB
    from pytest_flashckpt.models import load_card

    for scenario in suite.scenarios:
        assert load_card(scenario.card).num_params() * 4 * 3 >= 100e6, scenario.name


def test_article_suite_rows_are_distinct_configurations_over_three_workloads() -> None:
    from pytest_flashckpt.core.claims import MIN_WORKLOADS, TABLE

    rows: dict[str, list] = {}
    for scenario in load_suite("article").scenarios:
        rows.setdefault(scenario.article, []).append(scenario)
    assert set(rows) == {c.id for c in TABLE}
    configs = {tag: {(s.activation.strategy, s.save.strategy, s.save.layer_checkpoint_dir) for s in group} for tag, group in rows.items()}
    assert configs == {
        "prototype": {("selective_op", "async", None)},
        "medium": {("full", "selective", None)},
        "large": {("full", "scheduled", "layers")},
    }
    for tag, group in rows.items():
        assert len({(s.card, s.batch_size, s.seq_len) for s in group}) >= MIN_WORKLOADS, tag
        assert all({"memory", "timing", "checkpoint"} <= set(s.measure) for s in group), tag
    assert all(s.save.mem_basis == "peak" for s in rows["large"])


@pytest.mark.slow
def test_the_large_row_defers_saves_and_takes_none_above_its_threshold(tmp_path) -> None:
    """The shipped ``large`` row's schedule really defers (the threshold is a fraction of the measured peak, the
    gauge live tensor bytes): at every workload, deferrals > 0 and no save forced above the threshold."""
    import dataclasses

    import torch

    from pytest_flashckpt.runner.context import RunContext
    from pytest_flashckpt.runner.run import run_scenario

    ctx = RunContext(device=torch.device("cpu"), probe="cpu", workdir=tmp_path)
    for scenario in load_suite("article").scenarios:
        if scenario.article != "large":
            continue
        quick = dataclasses.replace(scenario, measure=("memory", "checkpoint"), save=dataclasses.replace(scenario.save, saves=2))
        result = run_scenario(quick, ctx)
        assert result.status == "measured", result.reason
        m = result.metrics
        assert m["deferrals"] > 0 and m["forced_saves"] == 0, (scenario.name, m["deferrals"], m["forced_saves"])
        assert m["max_save_memory_fraction"] < scenario.save.mem_threshold


def _slow_writes(monkeypatch, seconds: float) -> None:
    """Every background write takes ``seconds`` longer (a slow disk), before it writes anything."""
    write = Checkpointer._background

    def slow(self, *args):
        time.sleep(seconds)
        return write(self, *args)

    monkeypatch.setattr(Checkpointer, "_background", slow)


@pytest.mark.usefixtures("small_bandwidth_probes")
@pytest.mark.parametrize("staging", ["background", "overlapped"])
def test_wait_for_write_keeps_back_pressure_out_of_every_stall(monkeypatch, tmp_path, staging) -> None:
    """A write that outlasts a step: with ``wait_for_write`` the loop waits for it outside the save (its wait is
    ``write_wait_s``) and no save waits for the previous write; the control, saving every step without it, waits
    inside saves 2..n (back-pressure in the stall)."""
    _slow_writes(monkeypatch, 0.15)
    records = {}
    real_loop = measure._save_loop

    def keep(*args, **kwargs):
        loop = real_loop(*args, **kwargs)
        records[args[1].wait_for_write] = loop.records
        return loop

    monkeypatch.setattr(measure, "_save_loop", keep)
    for waits in (True, False):
        config = SaveConfig(strategy="async", staging=staging, save_interval=1, saves=3, time_lost_rounds=0, wait_for_write=waits)
        metrics = run_checkpoint_pass(make_trainer(), config, tmp_path / str(waits))
        assert metrics["steps"] == 3 and metrics["saves"] == 3
        if waits:
            assert [r.wait_s for r in records[True]] == pytest.approx([0, 0, 0], abs=0.01)
            assert len(metrics.samples["write_wait_s"]) == 3 and metrics.samples["write_wait_s"][0] < 0.01  # nothing in flight yet
            assert min(metrics.samples["write_wait_s"][1:]) > 0.05
        else:
            assert min(r.wait_s for r in records[False][1:]) > 0.05
            assert "write_wait_s" not in metrics.values


def test_wait_for_write_is_refused_where_it_means_nothing() -> None:
    with pytest.raises(ValueError, match="wait_for_write waits for a background write, but the sync save writes in the save call"):
        SaveConfig(strategy="sync", wait_for_write=True)
    with pytest.raises(ValueError, match="world_size 2: checkpoint.wait_for_write is a key of the one-process save loop"):
        Scenario("ranks", world_size=2, save=SaveConfig(strategy="dcp", async_save=True, wait_for_write=True))
    Scenario("ranks", world_size=2, save=SaveConfig(strategy="dcp", async_save=True))  # control: without it, valid
    with pytest.raises(TypeError, match=r"unknown save option\(s\) wait_for_write \(wait_for_write: how a suite's checkpoint pass"):
        _config("async", {"wait_for_write": True})


def test_the_staged_saves_of_the_checkpoint_suite_wait_for_each_write() -> None:
    """Every staged save of the default checkpoint suite saves every step and waits for the write in flight, so its
    stall never holds back-pressure; its blocking saves have nothing to wait for."""
    for scenario in load_suite("checkpoint").scenarios:
        assert scenario.save.wait_for_write == scenario.save.axes.background, scenario.name
        assert scenario.save.save_interval == 1, scenario.name
