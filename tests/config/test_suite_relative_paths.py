"""Relative paths in a suite (a card file, ``model.card``, a ``model.hf`` config.json, an ``include``) name the
files next to the suite, not in the current folder. Each case has a decoy of the same name in the current folder;
the control shows that reading the value as written (what the old code did) picks the decoy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_flashckpt.config.hf_spec import hf_limits
from pytest_flashckpt.config.model_card import load_card
from pytest_flashckpt.config.suites import load_suite

CARD = "name: {name}\nvocab_size: 64\nblock_size: 64\nn_layer: {layers}\nn_head: 2\nn_embd: 32\n"
DEFAULTS = "defaults: {batch_size: 1, seq_len: 16, attention: eager, measure: [memory]}\n"


@pytest.fixture
def places(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """(the suite's folder, the current folder elsewhere): each holds cards/c.yaml and config.json, different ones."""
    suite_dir, cwd = tmp_path / "suite", tmp_path / "elsewhere"
    for folder, name, layers in ((suite_dir, "suites-card", 2), (cwd, "decoy", 3)):
        (folder / "cards").mkdir(parents=True)
        (folder / "cards" / "c.yaml").write_text(CARD.format(name=name, layers=layers))
        (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": layers, "n_positions": 64}))
    monkeypatch.chdir(cwd)
    return suite_dir, cwd


def _suite(folder: Path, body: str, name: str = "s.yaml") -> Path:
    path = folder / name
    path.write_text(DEFAULTS + body)
    return path


@pytest.mark.parametrize("model", ["cards/c.yaml", "{card: cards/c.yaml}", "{card: ./cards/c.yaml, dropout: 0.0}"])
def test_a_card_path_is_read_next_to_the_suite(places, model):
    suite_dir, _ = places
    assert load_card("cards/c.yaml").name == "decoy"  # control: read as written, the path finds the decoy
    suite = load_suite(str(_suite(suite_dir, f"scenarios:\n  - {{name: a, model: {model}}}\n")))
    assert load_card(suite.scenarios[0].card).name == "suites-card"


def test_a_card_path_from_a_matrix_is_read_next_to_the_suite(places):
    suite_dir, _ = places
    body = "scenarios:\n  - {name: 'm-{card}', matrix: {model.card: [cards/c.yaml, tiny]}}\n"
    cards = [s.card for s in load_suite(str(_suite(suite_dir, body))).scenarios]
    assert load_card(cards[0]).name == "suites-card" and cards[1] == "tiny"  # a shipped name stays a name


def test_an_hf_config_json_is_read_next_to_the_suite(places):
    suite_dir, _ = places
    assert hf_limits("config.json")[0] == 3  # control: the decoy's layers
    suite = load_suite(str(_suite(suite_dir, "scenarios:\n  - {name: a, model: {hf: config.json}}\n")))
    assert hf_limits(suite.scenarios[0].model.hf)[0] == 2
    assert suite.scenarios[0].card == "hf:config.json"  # the report's card column is unchanged


def test_an_included_suite_path_and_its_own_paths_are_read_next_to_each_file(places):
    suite_dir, cwd = places
    (suite_dir / "more").mkdir()
    (suite_dir / "more" / "cards").mkdir()
    (suite_dir / "more" / "cards" / "c.yaml").write_text(CARD.format(name="included-card", layers=1))
    _suite(suite_dir / "more", "scenarios:\n  - {name: inner, model: cards/c.yaml}\n", "inner.yaml")
    (cwd / "more").mkdir()
    _suite(cwd / "more", "scenarios:\n  - {name: decoy-suite}\n", "inner.yaml")
    assert load_suite("more/inner.yaml").scenarios[0].name == "decoy-suite"  # control: read as written
    outer = load_suite(str(_suite(suite_dir, "include: [more/inner.yaml]\nscenarios:\n  - {name: outer}\n")))
    names = {s.name: s for s in outer.scenarios}
    assert "decoy-suite" not in names and set(names) == {"inner", "outer"}
    assert load_card(names["inner"].card).name == "included-card"


def test_run_from_the_suites_folder_the_strings_are_as_written(places, monkeypatch):
    suite_dir, _ = places
    monkeypatch.chdir(suite_dir)
    suite = load_suite(str(_suite(suite_dir, "scenarios:\n  - {name: a, model: {card: cards/c.yaml}}\n"
                                             "  - {name: b, model: {hf: config.json}}\n")))
    assert [s.card for s in suite.scenarios] == ["cards/c.yaml", "hf:config.json"]
    assert suite.scenarios[1].model.hf == "config.json"


def test_absolute_paths_stay_as_written(places):
    suite_dir, cwd = places
    decoy = (cwd / "cards" / "c.yaml").as_posix()
    suite = load_suite(str(_suite(suite_dir, f"scenarios:\n  - {{name: a, model: {{card: '{decoy}'}}}}\n")))
    assert load_card(suite.scenarios[0].card).name == "decoy"
