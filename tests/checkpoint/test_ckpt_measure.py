"""The runner's entry point, the bandwidth probes and the checkpoint suite file."""

from __future__ import annotations

import pytest

from ckpt_helpers import make_trainer
from pytest_flashckpt.checkpoint import METRICS, copy_bandwidth_GBps, run_checkpoint_pass, write_bandwidth_MBps
from pytest_flashckpt.config.scenario import SaveConfig
from pytest_flashckpt.config.suites import load_suite


@pytest.mark.parametrize(
    "config",
    [SaveConfig(strategy="sync", saves=2), SaveConfig(async_save=True, saves=2, max_keep=1), SaveConfig(layer_checkpoint_dir="l", saves=2)],
    ids=["sync", "async", "layerwise"],
)
def test_run_checkpoint_pass_returns_every_metric(config: SaveConfig, tmp_path) -> None:
    trainer = make_trainer()
    metrics = run_checkpoint_pass(trainer, config, tmp_path)
    for name in METRICS:
        assert metrics[name] is not None and metrics[name] >= 0, name
    for name in ("save_stall_s", "save_total_s", "bytes_written", "write_MBps", "save_extra_peak_bytes", "files"):
        assert len(metrics[f"{name}_samples"]) == 2
    assert metrics["saves"] == 2 and metrics["verified"] == "bitwise" and metrics["steps"] == 2
    rounds = config.time_lost_rounds
    assert len(metrics["time_lost_s_samples"]) == len(metrics["time_lost_plain_s_samples"]) == rounds
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


def test_checkpoint_suite_covers_every_strategy_and_the_article_rows() -> None:
    suite = load_suite("checkpoint")
    strategies = {s.save.strategy for s in suite.scenarios}
    assert strategies == {"sync", "async", "dcp", "selective", "layerwise", "scheduled"}
    rows = {s.article: s for s in suite.scenarios if s.article}
    assert set(rows) == {"prototype", "medium", "large"}
    assert rows["prototype"].save.strategy == "async" and rows["prototype"].activation.strategy == "full"
    assert rows["medium"].save.strategy == "selective"
    assert rows["large"].save.layer_checkpoint_dir and rows["large"].save.mem_threshold
    # every save strategy runs on a card whose training state (model + AdamW) is at least 100 MB
    from pytest_flashckpt.models import load_card

    io_rows = [s for s in suite.scenarios if not s.article]
    assert {s.save.strategy for s in io_rows} == strategies
    for scenario in io_rows:
        assert load_card(scenario.card).num_params() * 4 * 3 >= 100e6, scenario.name
