"""YAML merge keys (``<<: *defaults``, ``<<: [*a, *b]``) work in suite files with the spec's override order (the
mapping's own keys win, then earlier maps of a list), while the strict loader's protections (a key written twice,
alias bombs, recursive aliases) still hold through them. Controls: PyYAML's own merge gets a list's order wrong
(it keys merged keys by ``id()`` of their string), and the loader before merge keys refused them outright."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.suites import load_suite
from pytest_flashckpt.config.typed import load_yaml

SUITE = """\
name: merged
defaults: &base {model: tiny, batch_size: 1, seq_len: 32, attention: eager, measure: [memory]}
scenarios:
  - <<: *base
    name: own-key-wins
    batch_size: 2
  - <<: [{seq_len: 64}, *base]
    name: earlier-map-wins
"""


def _write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _one_line(info: pytest.ExceptionInfo) -> str:
    text = str(info.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_merge_keys_fill_scenarios_and_the_own_key_wins(tmp_path):
    suite = load_suite(str(_write(tmp_path, SUITE)))
    by_name = {s.name: s for s in suite.scenarios}
    assert by_name["own-key-wins"].batch_size == 2 and by_name["own-key-wins"].seq_len == 32
    assert by_name["earlier-map-wins"].seq_len == 64 and by_name["earlier-map-wins"].batch_size == 1


def test_a_list_of_maps_keeps_the_specs_order_where_pyyaml_does_not(tmp_path):
    path = _write(tmp_path, SUITE)
    assert load_yaml(path)["scenarios"][1]["seq_len"] == 64
    # control: PyYAML's own merge lets the later map (*base, seq_len 32) win over the earlier one
    assert yaml.safe_load(path.read_text())["scenarios"][1]["seq_len"] == 32


def test_the_loader_without_merge_support_refused_a_merge_key(tmp_path):
    """Control for the old behaviour: a SafeLoader whose mapping constructor reads each key as an object (as the
    strict loader's duplicate check did) cannot construct the ``<<`` key at all."""

    class KeysAsObjects(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            for key_node, _ in node.value:
                self.construct_object(key_node, deep=True)
            return super().construct_mapping(node, deep=deep)

    KeysAsObjects.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, KeysAsObjects.construct_mapping)
    with pytest.raises(yaml.constructor.ConstructorError, match="merge"):
        yaml.load(SUITE, Loader=KeysAsObjects)  # noqa: S506 (a SafeLoader subclass)


def test_a_merged_map_built_again_is_not_a_key_written_twice(tmp_path):
    text = (
        "name: chained\n"
        "defaults: {model: tiny, batch_size: 1, measure: [memory], attention: eager}\n"
        "scenarios:\n"
        "  - name: first\n"
        "    <<: &longer {<<: {seq_len: 32}, seq_len: 64}\n"
        "  - name: second\n"
        "    <<: *longer\n"
    )
    suite = load_suite(str(_write(tmp_path, text)))
    assert [s.seq_len for s in suite.scenarios] == [64, 64]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        # an explicit key written twice next to a merge is still refused
        ("d: &d {seq_len: 32}\nscenarios:\n  - <<: *d\n    name: x\n    name: y\n", "line 5: key 'name' is given twice"),
        # two merge keys in one mapping are a key given twice
        ("d: &d {seq_len: 32}\nscenarios:\n  - <<: *d\n    <<: *d\n    name: x\n", "line 4: key '<<' is given twice"),
        # a merge of something that is not a mapping
        ("scenarios:\n  - <<: [1, 2]\n    name: x\n", "a merge key (<<) takes a mapping or a list of mappings, not a scalar"),
        # a mapping that merges itself
        ("scenarios:\n  - &me\n    name: x\n    <<: *me\n", "recursive alias"),
    ],
)
def test_bad_merges_are_one_line_errors(tmp_path, text, words):
    with pytest.raises(ConfigError) as info:
        load_yaml(_write(tmp_path, text))
    assert words in _one_line(info)


def test_an_alias_bomb_through_merge_keys_is_refused(tmp_path):
    levels = ["a0: &a0 {" + ", ".join(f"k{i}: lol" for i in range(9)) + "}"]
    for level in range(1, 9):
        merged = ", ".join(f"m{i}: *a{level - 1}" for i in range(9))
        levels.append(f"a{level}: &a{level} {{<<: *a{level - 1}, {merged}}}")
    text = "\n".join(levels) + "\nscenarios: [{name: boom, description: *a8}]\n"
    with pytest.raises(ConfigError) as info:
        load_yaml(_write(tmp_path, text))
    assert "YAML aliases expand this file by more than" in _one_line(info)
