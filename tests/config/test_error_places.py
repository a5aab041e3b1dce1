"""Every bad value in a suite names its place, once: the suite file, the scenario, the key, and the fix, before
anything runs (``load_checked_suite``: the suite read, every scenario built and preflighted)."""

from __future__ import annotations

import textwrap

import pytest

from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.runner.suite import load_checked_suite


def _load(tmp_path, monkeypatch, text: str, name: str = "x.yaml") -> ConfigError:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "suites").mkdir(exist_ok=True)
    (tmp_path / "suites" / name).write_text(textwrap.dedent(text), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_checked_suite(f"suites/{name}")
    error = info.value  # no chained-exception noise: nothing shown as its cause or context
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    return info.value


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("- {name: foo, model: gpt5-huge}",
         "suites/x.yaml: scenario 'foo': model.card: unknown model card 'gpt5-huge' (valid names: "),
        ("- {name: foo, seq_len: 4096}",
         "suites/x.yaml: scenario 'foo': seq_len: 4096 exceeds the 2048 positions of model card 'tiny' (use a shorter"),
        ("- {name: foo, activation: {strategy: every_k, k: 9}}",
         "suites/x.yaml: scenario 'foo': activation.k: 9 is larger than the 4 blocks of 'tiny' (valid: 1..4)"),
        ("- {name: foo, batch_size: 3, simulate: {enabled: true, world_size: 2}}",
         "suites/x.yaml: scenario 'foo': simulate.world_size: 2 does not divide batch_size 3 (use a batch"),
        ("- {name: foo, model: {card: tiny, dropout: 1.5}}",
         "suites/x.yaml: scenario 'foo': model.dropout: must be in [0, 1), got 1.5"),
        ("- {name: foo, attention: fast}",
         "suites/x.yaml: scenario 'foo': attention: 'fast' is not a valid choice (valid: auto, flash_attn, sdpa, eager)"),
        ("- {name: foo, activation: {strategy: budget, budget: 6 GB/s}}",
         "suites/x.yaml: scenario 'foo': activation.budget: '6 GB/s' is not a size"),
        ("- {name: foo, bogus: 1}", "suites/x.yaml: scenario 'foo': unknown key 'bogus' (valid keys: "),
        ("- {name: 's{seq_len}', matrix: {seq_len: [64]}, batch_size: -1}",
         "suites/x.yaml: scenario 's64': batch_size must be positive, got -1"),
        ("- {name: '{nope}', matrix: {seq_len: [64]}}",
         "suites/x.yaml: scenario '{nope}': name: the template uses 'nope', which is not a matrix key (matrix keys: "),
        ("- {name: foo, checkpoint: {strategy: sync, saves: 0}}", "suites/x.yaml: scenario 'foo': checkpoint: saves must be positive, got 0"),
    ],
)
def test_a_bad_value_names_file_scenario_key_and_fix(tmp_path, monkeypatch, body, expected) -> None:
    message = str(_load(tmp_path, monkeypatch, "name: x\nscenarios:\n  " + body + "\n"))
    assert message.startswith(expected), message
    assert message.count("suites/x.yaml") == 1 and message.count("valid names") <= 1  # said once


def test_a_bad_model_card_file_names_the_card_file_too(tmp_path, monkeypatch) -> None:
    (tmp_path / "suites" / "cards").mkdir(parents=True)  # a card path in a suite is read next to the suite
    (tmp_path / "suites" / "cards" / "odd.yaml").write_text("n_embd: 100\nn_head: 3\n", encoding="utf-8")
    message = str(_load(tmp_path, monkeypatch, "scenarios:\n  - {name: foo, model: cards/odd.yaml}\n"))
    assert message == ("suites/x.yaml: scenario 'foo': model.card: suites/cards/odd.yaml: n_embd (100) must be divisible by "
                       "n_head (3)")


def test_an_included_suites_scenario_names_its_own_file(tmp_path, monkeypatch) -> None:
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "inner.yaml").write_text("scenarios:\n  - {name: deep, model: gpt5-huge}\n", encoding="utf-8")
    message = str(_load(tmp_path, monkeypatch, "include: [inner.yaml]\nscenarios:\n  - {name: top}\n", "outer.yaml"))
    assert message.startswith("suites/inner.yaml: scenario 'deep': model.card: unknown model card 'gpt5-huge'")


def test_an_unknown_included_suite_names_the_include_key(tmp_path, monkeypatch) -> None:
    message = str(_load(tmp_path, monkeypatch, "include: [no-such]\nscenarios: []\n"))
    assert message.startswith("suites/x.yaml: include[0]: unknown suite 'no-such' (valid names: ")


def test_the_plugin_reports_it_once_as_a_usage_error(pytester) -> None:
    pytester.makefile(".yaml", x="scenarios:\n  - {name: foo, model: gpt5-huge}\n")
    result = pytester.runpytest_inprocess("--flashckpt-suite=x.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if "gpt5-huge" in line]
    assert errors == [errors[0]] and errors[0].startswith("ERROR: flashckpt: x.yaml: scenario 'foo': model.card: unknown model card")
    assert "Traceback" not in result.stderr.str() and not (pytester.path / "flashckpt-report").exists()
    result = pytester.runpytest_inprocess("--flashckpt-suite=no-such-suite")
    result.stderr.fnmatch_lines(["ERROR: flashckpt: --flashckpt-suite: unknown suite 'no-such-suite' (valid names: *"])
