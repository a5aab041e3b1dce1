"""The axes reserved for the next issues (config.axes): today's values are accepted and change no fingerprint;
anything else is refused before anything runs, naming the key and the issue that builds it."""

from __future__ import annotations

import pytest

from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.fingerprint import fingerprint, fingerprinted
from pytest_flashckpt.config.scenario import Scenario
from pytest_flashckpt.config.typed import build


@pytest.mark.parametrize("key, value, issue, others", [
    ("compile", {"mode": "reduce-overhead"}, "issue 33", {}),
])
def test_a_value_beyond_today_is_refused_naming_the_key_and_the_issue(key, value, issue, others):
    with pytest.raises(ConfigError) as info:
        build(Scenario, {"name": "s", key: value, **others}, "suite.yaml")
    text = str(info.value)
    assert text.startswith("suite.yaml: ") and f"{key}.{next(iter(value))}" in text and issue in text and "not built yet" in text


def test_the_layout_axis_reserves_nothing_now_that_every_composition_is_built():
    """The last layout issue 32 refused (compiled pipeline stages with context parallel inside,
    reports/spike-compiled-cp-stages.md) builds."""
    built = build(Scenario, {"name": "s", "layout": {"cp": 2, "pp": 2}, "world_size": 4, "batch_size": 4,
                             "model": "llama-tiny", "compile": {"scope": "block"}, "checkpoint": {"strategy": "none"},
                             "activation": {"strategy": "full"}}, "suite.yaml")
    assert built.compile.enabled and built.parallel_layout.describe() == "dp_shard 1 x tp 1 x pp 2 x cp 2"


def test_todays_values_are_accepted_and_leave_the_fingerprint_as_it_was():
    plain = build(Scenario, {"name": "s"}, "suite.yaml")
    written = build(Scenario, {"name": "s", "layout": {"tp": 1, "pp": 1}, "compile": {"scope": "none"}},
                              "suite.yaml")
    assert written == plain and fingerprint(written) == fingerprint(plain)
    assert not any(k.split(".")[0] in ("layout", "compile", "step_impl") for k in fingerprinted(plain))
    assert fingerprint(build(Scenario, {"name": "s", "seq_len": 256}, "suite.yaml")) != fingerprint(plain)  # control
    fused = build(Scenario, {"name": "s", "step_impl": {"optimizer": "adamw_fused"}}, "suite.yaml")
    assert fingerprint(fused) != fingerprint(plain)  # a built axis set away from its default enters the fingerprint


def test_a_key_added_to_an_axis_changes_no_fingerprint_at_its_default():
    """compile.ac_wrapper came after compiled rows were fingerprinted: at its default (inside) a compiled row's
    fingerprint is what it was; set to outside, it changes."""
    compiled = {"name": "s", "activation": {"strategy": "full"}}
    before = build(Scenario, {**compiled, "compile": {"scope": "block"}}, "suite.yaml")
    inside = build(Scenario, {**compiled, "compile": {"scope": "block", "ac_wrapper": "inside"}}, "suite.yaml")
    outside = build(Scenario, {**compiled, "compile": {"scope": "block", "ac_wrapper": "outside"}}, "suite.yaml")
    assert "compile.ac_wrapper" not in fingerprinted(before) and fingerprint(inside) == fingerprint(before)
    assert fingerprinted(outside)["compile.ac_wrapper"] == "outside" and fingerprint(outside) != fingerprint(before)
    assert fingerprinted(before)["compile.scope"] == "block"  # control: the axis's other keys are fingerprinted
