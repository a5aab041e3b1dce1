"""A save is three axes (layout, staging, schedule); the seed's strategy names are presets of them.

Each preset resolves to the axes it had, and writes the files it wrote; a setting beside a preset overrides its
axis (except the axis the preset is named for); axes no preset names get a derived name; impossible combinations
are refused at config time."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from ckpt_helpers import make_trainer
from pytest_flashckpt.checkpoint import Checkpointer, resume_latest
from pytest_flashckpt.checkpoint.manifest import read_manifest
from pytest_flashckpt.config.scenario import SaveConfig
from pytest_flashckpt.core.registry import SAVE_PRESETS, save_strategy_names

# what the seed's SaveConfig of each preset (or article key) did: name, layout, staging, schedule
SEED = [
    ({"strategy": "sync"}, "sync", "file", "blocking", "every"),
    ({"strategy": "sync", "format": "safetensors"}, "sync", "file", "blocking", "every"),
    ({"strategy": "async"}, "async", "file", "background", "every"),
    ({"async_save": True}, "async", "file", "background", "every"),
    ({"strategy": "async", "staging": "overlapped"}, "async", "file", "overlapped", "every"),
    ({"staging": "overlapped"}, "async", "file", "overlapped", "every"),
    ({"strategy": "async", "layer_checkpoint_dir": "blk"}, "async", "layerwise", "background", "every"),
    ({"strategy": "dcp"}, "dcp", "dcp", "blocking", "every"),
    ({"strategy": "dcp", "async_save": True}, "dcp", "dcp", "background", "every"),
    ({"strategy": "dcp", "layer_checkpoint_dir": "blk"}, "dcp", "dcp", "blocking", "every"),
    ({"strategy": "selective"}, "selective", "selected", "blocking", "every"),
    ({"select_params": "trainable"}, "selective", "selected", "blocking", "every"),
    ({"strategy": "selective", "async_save": True}, "selective", "selected", "background", "every"),
    ({"strategy": "layerwise"}, "layerwise", "layerwise", "blocking", "every"),
    ({"layer_checkpoint_dir": "layers"}, "layerwise", "layerwise", "blocking", "every"),
    ({"strategy": "scheduled"}, "scheduled", "file", "blocking", "memory_aware"),
    ({"mem_threshold": 0.8}, "scheduled", "file", "blocking", "memory_aware"),
    ({"strategy": "scheduled", "layer_checkpoint_dir": "layers", "mem_threshold": 0.6}, "scheduled", "layerwise", "blocking", "memory_aware"),
    ({"strategy": "dcp", "mem_threshold": 0.8}, "dcp", "dcp", "blocking", "memory_aware"),
]


@pytest.mark.parametrize(("settings", "name", "layout", "staging", "schedule"), SEED, ids=lambda v: str(v))
def test_each_preset_resolves_to_the_axes_it_had(settings, name, layout, staging, schedule) -> None:
    config = SaveConfig(**settings)
    assert (config.strategy, config.axes.layout, config.axes.staging, config.axes.schedule) == (name, layout, staging, schedule)
    again = dataclasses.replace(config, saves=5)  # replace() runs __post_init__ again on the resolved name
    assert (again.strategy, again.axes) == (config.strategy, config.axes)


def test_the_preset_table_holds_the_seed_strategies() -> None:
    seed = {
        "sync": ("file", "blocking", "every"), "async": ("file", "background", "every"), "dcp": ("dcp", "blocking", "every"),
        "selective": ("selected", "blocking", "every"), "layerwise": ("layerwise", "blocking", "every"),
        "scheduled": ("file", "blocking", "memory_aware"),
    }
    assert {n: (p.layout, p.staging, p.schedule) for n, p in SAVE_PRESETS.items()}.items() >= seed.items()  # new presets may join
    assert SaveConfig().strategy == "none" and SaveConfig(format="safetensors", saves=2).strategy == "none"


# the files one save of each preset writes (tensor files plus meta.json and manifest.json), as the seed wrote them
SEED_FILES = {
    "sync": ["meta.json", "state.pt"],
    "async": ["meta.json", "state.pt"],
    "dcp": ["dcp/.metadata", "dcp/__0_0.distcp", "meta.json"],
    "selective": ["meta.json", "state.pt"],  # the first save is the full base
    "layerwise": ["layers/block_000.pt", "layers/block_001.pt", "layers/rest.pt", "meta.json"],
    "scheduled": ["meta.json", "state.pt"],
}
SEED_KEYS = {"strategy", "format", "save_interval", "async_save", "staging", "max_keep", "select_params", "mem_threshold",
             "mem_basis", "max_defer_steps", "layer_checkpoint_dir", "saves", "time_lost_rounds"}


@pytest.mark.parametrize("name", sorted(SEED_FILES))
def test_each_preset_writes_the_seed_files_and_manifest(name: str, tmp_path: Path) -> None:
    trainer = make_trainer()
    trainer.train_step()
    with Checkpointer(tmp_path, SaveConfig(strategy=name)) as ckpt:
        record = ckpt.save(trainer)
    folder = tmp_path / record.name
    written = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert written == sorted([*SEED_FILES[name], "manifest.json"]) and record.files == len(written)
    manifest = read_manifest(folder)
    assert manifest.strategy == name and set(manifest.config) == SEED_KEYS  # the bytes a preset's manifest always had
    assert manifest.config["staging"] == "blocking"  # the seed's word for a copy at the save call
    assert record.bytes_written == sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_an_axis_setting_beside_a_preset_overrides_it_and_keeps_the_name() -> None:
    config = SaveConfig(strategy="async", layout="layerwise", schedule="memory_aware", mem_threshold=0.9)
    assert (config.strategy, config.axes.layout, config.axes.staging, config.axes.schedule) == ("async", "layerwise", "background", "memory_aware")
    assert SaveConfig(strategy="dcp", staging="background").axes.background


@pytest.mark.parametrize(("settings", "message"), [
    ({"strategy": "async", "staging": "blocking"}, r"staging: blocking contradicts strategy 'async', the preset of staging 'background'; drop staging, or name strategy 'sync'"),
    ({"strategy": "dcp", "layout": "file"}, r"layout: file contradicts strategy 'dcp', the preset of layout 'dcp'"),
    ({"strategy": "dcp", "select_params": True}, r"select_params \(layout 'selected'\) contradicts strategy 'dcp'.*name strategy 'selective'"),
    ({"strategy": "scheduled", "schedule": "every"}, r"schedule: every contradicts strategy 'scheduled'"),
])
def test_a_setting_against_the_axis_a_preset_is_named_for_is_refused(settings, message) -> None:
    with pytest.raises(ValueError, match=message):
        SaveConfig(**settings)


def test_axes_no_preset_names_get_a_derived_stable_name() -> None:
    config = SaveConfig(layout="dcp", staging="background", save_interval=2)
    assert config.strategy == "dcp-background-every"
    assert SaveConfig(save_interval=2, staging="background", layout="dcp").strategy == config.strategy  # key order is no part of it
    assert SaveConfig(async_save=True, select_params=True).strategy == "selected-background-every"  # the seed refused these
    assert dataclasses.replace(config, saves=1).strategy == config.strategy
    assert SaveConfig(strategy="dcp-background-every", layout="dcp", staging="background").strategy == config.strategy
    assert config.recorded()["layout"] == "dcp" and config.recorded()["staging"] == "background"
    with pytest.raises(ValueError, match=r"strategy: 'dcp-background-every' is not the name of these settings \('dcp'\)"):
        SaveConfig(strategy="dcp-background-every", layout="dcp")
    one_axis = SaveConfig(layout="dcp")  # one axis away from sync: the preset named for it, as the article keys are
    assert one_axis.strategy == "dcp"


@pytest.mark.parametrize(("settings", "message"), [
    ({"layout": "dcp", "staging": "overlapped"}, r"valid stagings for layout dcp: blocking, background"),
    ({"strategy": "dcp", "async_save": True, "layer_checkpoint_dir": "blk"}, r"layer_checkpoint_dir with layout dcp .* drop layer_checkpoint_dir or use staging: blocking"),
    ({"strategy": "dcp", "format": "safetensors"}, r"format: safetensors .* layout dcp writes DCP's own files"),
    ({"schedule": "memory_aware"}, r"schedule: memory_aware .* set mem_threshold"),
    ({"layout": "file", "layer_checkpoint_dir": "blk"}, r"layout file is one file: use layout: layerwise"),
    ({"schedule": "every", "mem_threshold": 0.5}, r"schedule: every and mem_threshold \(schedule 'memory_aware'\) set the schedule two ways"),
    ({"async_save": True, "staging": "blocking"}, r"staging: blocking writes the save while training waits, but async_save: true"),
    ({"layout": "tape"}, r"layout: 'tape' is not a layout; valid: file, layerwise, selected, dcp"),
    ({"strategy": "fast"}, rf"strategy: 'fast' is not a save strategy; valid: {re.escape(', '.join(save_strategy_names()))}$"),
])
def test_impossible_combinations_are_refused_at_config_time(settings, message) -> None:
    with pytest.raises(ValueError, match=message):
        SaveConfig(**settings)


def test_a_new_combination_saves_and_resumes_exactly(tmp_path: Path) -> None:
    """dcp every 2 steps, written in the background: a combination the seed had no name for."""
    config = SaveConfig(layout="dcp", staging="background", save_interval=2, max_keep=1)
    trainer = make_trainer()
    with Checkpointer(tmp_path, config) as ckpt:
        saved = []
        for _ in range(4):
            trainer.train_step()
            record = ckpt.maybe_save(trainer)
            if record is not None:
                saved.append(record.step)
    assert saved == [2, 4] and [p.name for p in tmp_path.iterdir() if p.name.startswith("ckpt-")] == [record.name]
    assert read_manifest(tmp_path / record.name).strategy == "dcp-background-every"
    resumed = make_trainer(init_seed=1)
    assert resume_latest(resumed, tmp_path).manifest.step == 4


@pytest.mark.parametrize("settings", [{"strategy": "async", "staging": "overlapped"}, {"layout": "dcp", "staging": "background"},
                                      {"mem_threshold": 0.8, "async_save": True}, {}])
def test_a_scenario_as_json_builds_back_to_the_same_save(settings) -> None:
    """A distributed rank reads its scenario back from ``to_plain`` JSON: the resolved name must build again."""
    import json

    from pytest_flashckpt.config.scenario import Scenario
    from pytest_flashckpt.config.typed import build, to_plain

    scenario = Scenario(name="s", save=SaveConfig(**settings))
    again = build(Scenario, json.loads(json.dumps(to_plain(scenario))), "scenario.json")
    assert (again.save, again.save.strategy, again.save.axes) == (scenario.save, scenario.save.strategy, scenario.save.axes)


@pytest.mark.parametrize(("save", "shown"), [({"strategy": "dcp", "staging": "background"}, "'dcp' with staging"),
                                             ({"strategy": "dcp", "mem_threshold": 0.5}, "'dcp' with mem_threshold"),
                                             ({"layout": "dcp"}, "'dcp' with layout")])
def test_sharded_saves_take_the_dcp_preset_only(save, shown) -> None:
    """A rank's sharded save reads strategy and async_save (distributed.rank); an axis setting would be ignored there."""
    from pytest_flashckpt.config.scenario import Scenario

    with pytest.raises(ValueError, match=f"world_size 2: sharded saves use checkpoint.strategy dcp .* not {shown};"):
        Scenario(name="s", world_size=2, save=SaveConfig(**save))
    assert Scenario(name="s", world_size=2, save=SaveConfig(strategy="dcp", async_save=True)).save.axes.background
