"""Suite files: the shipped suites validate; bad input names the file, the key path and the valid choices;
the article's keys are accepted as written there."""

import dataclasses
import re
import textwrap

import pytest

from pytest_flashckpt.config.data import shipped_names
from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.suites import load_suite
from pytest_flashckpt.config.preflight import preflight
from pytest_flashckpt.core.registry import ACTIVATION_STRATEGIES, save_strategy_names

# the valid names an error lists are the registry's, in its order: a strategy or preset added there changes them
_ACTIVATION_NAMES = re.escape(", ".join(ACTIVATION_STRATEGIES))
_SAVE_NAMES = re.escape(", ".join(save_strategy_names()))


def _suite(tmp_path, text, name="s.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


@pytest.mark.parametrize("name", shipped_names("suites"))
def test_every_shipped_suite_validates(name):
    suite = load_suite(name)
    assert suite.scenarios
    for scenario in suite.scenarios:
        preflight(scenario)


def test_matrix_expands_with_name_templates(tmp_path):
    suite = load_suite(_suite(tmp_path, """
        name: m
        defaults: {model: tiny, seq_len: 128}
        scenarios:
          - name: "{attention}-s{seq_len}-{strategy}"
            matrix: {attention: [eager, sdpa], seq_len: [64, 128], activation.strategy: [none, full]}
    """))
    names = [s.name for s in suite.scenarios]
    assert len(names) == 8 and "eager-s64-full" in names
    full = next(s for s in suite.scenarios if s.name == "sdpa-s128-full")
    assert full.activation.strategy == "full" and full.seq_len == 128 and full.suite == "m"


def test_article_keys_are_accepted_as_written(tmp_path):
    suite = load_suite(_suite(tmp_path, """
        scenarios:
          - name: article-model
            model: {card: tiny, type: GPT, gradient_checkpointing: true, checkpoint_level: layer, layer_checkpoint_dir: ./checkpoints/layers}
          - name: article-checkpoint
            checkpoint: {save_interval: 1000, async_save: true, max_keep: 5}
          - name: article-selective
            checkpoint: {select_params: true}
          - name: article-dynamic
            checkpoint: {mem_threshold: 0.8, save_interval: 2}
          - name: activation-alias
            activation: {gradient_checkpointing: true}
    """))
    s = {x.name: x for x in suite.scenarios}
    assert s["article-model"].activation.strategy == "full"
    assert s["article-model"].save.strategy == "layerwise"
    assert s["article-model"].save.layer_checkpoint_dir == "./checkpoints/layers"
    assert s["article-checkpoint"].save.strategy == "async" and s["article-checkpoint"].save.max_keep == 5
    assert "checkpoint" in s["article-checkpoint"].measure
    assert s["article-selective"].save.strategy == "selective"
    assert s["article-dynamic"].save.strategy == "scheduled"
    assert s["activation-alias"].activation.strategy == "full"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("scenarios:\n  - name: a\n    sequence: 5\n", r"scenario 'a': unknown key 'sequence' \(valid keys: .*seq_len"),
        ("scenarios:\n  - name: a\n    seq_len: long\n", r"scenario 'a': seq_len: expected an integer, got str 'long'"),
        ("scenarios:\n  - name: a\n    attention: xformers\n", r"'xformers' is not a valid choice \(valid: auto, flash_attn, sdpa, eager\)"),
        ("scenarios:\n  - name: a\n    activation: {strategy: magic}\n", rf"activation.strategy: 'magic' is not a valid choice \(valid: {_ACTIVATION_NAMES}\)"),
        ("scenarios:\n  - name: a\n    activation: {strategy: every_k, k: 0}\n", r"activation.k must be a positive number of blocks, got 0"),
        ("scenarios:\n  - name: a\n    batch_size: -1\n", r"batch_size must be positive, got -1"),
        ("scenarios:\n  - name: a\n    checkpoint: {mem_threshold: 80}\n", r"mem_threshold is a fraction of memory capacity in \(0, 1\], got 80"),
        ("scenarios:\n  - name: a\n    checkpoint: {strategy: asnyc}\n", rf"scenario 'a': checkpoint: strategy: 'asnyc' is not a save strategy; valid: {_SAVE_NAMES}$"),
        ("scenarios:\n  - name: a\n    checkpoint: {layout: tape}\n", r"checkpoint.layout: 'tape' is not a valid choice \(valid: file, layerwise, selected, dcp\)"),
        ("scenarios:\n  - name: a\n    checkpoint: {strategy: dcp, staging: overlapped}\n",
         r"scenario 'a': checkpoint: staging: overlapped .* valid stagings for layout dcp: blocking, background"),
        ("scenarios:\n  - name: a\n    checkpoint: {strategy: async, staging: blocking}\n",
         r"scenario 'a': checkpoint: staging: blocking contradicts strategy 'async', the preset of staging 'background'; drop staging, or name strategy 'sync'"),
        ("scenarios:\n  - name: a\n    checkpoint: {layout: dcp, select_params: true}\n",
         r"scenario 'a': checkpoint: layout: dcp and select_params \(layout 'selected'\) set the layout two ways"),
        ("scenarios:\n  - name: a\n  - name: a\n", r"scenario name '.*::a' is used twice"),
        ("scenarios:\n  - name: '{nope}'\n    matrix: {seq_len: [1]}\n", r"scenario '{nope}': name: the template uses 'nope', which is not a matrix key"),
        ("scenarios:\n  - seq_len: 5\n", r"scenarios\[0\] has no name"),
        ("scenario: []\n", r"unknown key 'scenario' \(valid keys: name, description, defaults, include, scenarios\)"),
        ("scenarios: [\n", r"not valid YAML"),
        ("include: [no-such-suite]\nscenarios: []\n", r"unknown suite 'no-such-suite'.*valid names: .*default"),
    ],
)
def test_bad_suites_name_the_file_key_and_fix(tmp_path, text, message):
    path = _suite(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as info:
        load_suite(path)
    if "no-such-suite" not in text:
        assert str(info.value).startswith(path)


def test_preflight_checks_the_model_card(tmp_path):
    suite = load_suite(_suite(tmp_path, """
        scenarios:
          - {name: too-long, model: tiny, seq_len: 4096}
          - {name: k-too-big, model: tiny, activation: {strategy: every_k, k: 9}}
    """))
    with pytest.raises(ConfigError, match="scenario 'too-long': seq_len: 4096 exceeds the 2048 positions"):
        preflight(suite.scenarios[0])
    with pytest.raises(ConfigError, match="scenario 'k-too-big': activation.k: 9 is larger than the 4 blocks of 'tiny' \\(valid: 1..4\\)"):
        preflight(suite.scenarios[1])


def _assert_plain_reference(scenario):
    reference = scenario.reference()
    assert reference.activation.strategy == "none", f"{scenario.name}: reference recomputes activations"
    assert reference.is_reference
    plain = ("none", "dcp") if scenario.world_size > 1 else ("none", "sync")
    assert reference.save.strategy in plain and not reference.save.async_save, f"{scenario.name}: reference saves {reference.save.strategy}"
    assert reference.model.gradient_checkpointing is None and reference.model.checkpoint_level is None
    assert reference.model.card == scenario.model.card and reference.seq_len == scenario.seq_len
    assert reference.reference() == dataclasses.replace(reference, name=f"{reference.name}.reference")


@pytest.mark.parametrize("name", shipped_names("suites"))
def test_a_reference_never_checkpoints_activations_in_any_shipped_suite(name):
    for scenario in load_suite(name).scenarios:
        _assert_plain_reference(scenario)


def test_reference_of_the_article_aliases_is_plain(tmp_path):
    """``gradient_checkpointing: true`` and ``checkpoint_level: layer`` on the model are folded into the strategies
    by ``__post_init__``; ``dataclasses.replace`` re-runs it, so the reference must clear them, not inherit them."""
    suite = load_suite(_suite(tmp_path, """
        scenarios:
          - name: gc
            model: {card: tiny, gradient_checkpointing: true}
          - name: layer
            model: {card: tiny, gradient_checkpointing: true, checkpoint_level: layer, layer_checkpoint_dir: layers}
            checkpoint: {save_interval: 2}
    """))
    for scenario in suite.scenarios:
        assert scenario.activation.strategy == "full"
        _assert_plain_reference(scenario)
    layer = suite.scenarios[1]
    assert layer.save.strategy == "layerwise" and layer.reference().save.strategy == "sync"
