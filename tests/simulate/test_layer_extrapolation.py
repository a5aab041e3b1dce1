"""The simulated rank read off the line through shallower depths (``simulate.layer_extrapolation``) equals the whole
card's simulation to the byte, and the resize-tracking rank probe (``simulate.rank_probe``) reads what the gloo
ranks' probe (``distributed.memory``) reads. The cheap cases run by default, in this process, one after the other
(``simulate_rank`` starts the fake process group and destroys it after each depth, as ``flashckpt simulate
--world-size`` does in tests/simulate/test_layouts.py: no fresh interpreter and its torch import needed); the others
run with ``-m slow`` in fresh interpreters (``extrapolation_cases.py``), two at a time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from extrapolation_cases import run as run_case
from fresh_python import run_together

from pytest_flashckpt.simulate.layer_extrapolation import LINEAR_KEYS, line_through, sample_depths

CASES_SCRIPT = Path(__file__).with_name("extrapolation_cases.py")
LLAMA = {"n_embd": 64, "n_head": 4, "n_kv_head": 2, "intermediate_size": 88, "vocab_size": 256, "block_size": 64}
GPT = {"n_embd": 64, "n_head": 4, "vocab_size": 256, "block_size": 64}
BYTES = ("peak_bytes", *LINEAR_KEYS)


EXTRAPOLATED = ["extrapolated", "whole"]
PROBES = ["whole", "exact_probe"]


def _case(name, card, overrides, n_layer, dp, tp, strategy, precision, ways=EXTRAPOLATED, foreach=None) -> dict:
    return {"name": name, "card": card, "overrides": {**overrides, "n_layer": n_layer}, "dp": dp, "tp": tp,
            "strategy": strategy, "precision": precision, "batch": 4, "seq": 16, "ways": ways, "foreach": foreach}


FAST = [  # one FSDP mixed-precision card extrapolated (foreach AdamW, as the CLI runs it), the two probes on an FSDP card
    _case("llama-fsdp2-full-mixed-foreach", "llama-tiny", LLAMA, 6, 2, 1, "full", "mixed", foreach=True),
    _case("llama-fsdp2-full-pure-probes", "llama-tiny", LLAMA, 4, 2, 1, "full", "pure", ways=PROBES),
]
SLOW = [
    _case("llama-fsdp2-full-mixed", "llama-tiny", LLAMA, 6, 2, 1, "full", "mixed"),
    _case("llama-2d-full-mixed", "llama-tiny", LLAMA, 6, 2, 2, "full", "mixed"),
    _case("llama-fsdp2-full-pure", "llama-tiny", LLAMA, 6, 2, 1, "full", "pure", ways=[*EXTRAPOLATED, "exact_probe"]),
    _case("llama-2d-none-mixed", "llama-tiny", LLAMA, 6, 2, 2, "none", "mixed"),
    _case("llama-fsdp2-every_k-pure", "llama-tiny", LLAMA, 10, 2, 1, "every_k", "pure"),
    _case("llama-2d-every_k-mixed", "llama-tiny", LLAMA, 11, 2, 2, "every_k", "mixed", ways=[*EXTRAPOLATED, "exact_probe"]),
    _case("llama-tp2-full-mixed", "llama-tiny", LLAMA, 6, 1, 2, "full", "mixed"),
    _case("llama-fsdp4-selective_op-pure", "llama-tiny", LLAMA, 6, 4, 1, "selective_op", "pure"),
    _case("gpt-fsdp2-none-mixed", "tiny", GPT, 6, 2, 1, "none", "mixed"),
    _case("gpt-fsdp2-full-pure", "tiny", GPT, 7, 2, 1, "full", "pure"),
]


def _run(cases: list[dict]) -> dict:
    """Each case in its own interpreter (two cores: two at a time)."""
    results: dict = {}
    for pair in (cases[i:i + 2] for i in range(0, len(cases), 2)):
        scripts = {c["name"]: [CASES_SCRIPT, json.dumps([c])] for c in pair}
        results.update({name: out[name] for name, out in run_together(scripts, timeout=600).items()})
    return results


def _check(records: dict) -> None:
    whole = records["whole"]
    assert whole["extrapolated"] is False and whole["simulated_depths"] == [whole["n_layer"]]
    if "extrapolated" in records:
        extrapolated = records["extrapolated"]
        assert extrapolated["extrapolated"] is True, extrapolated["simulated_depths"]
        assert max(extrapolated["simulated_depths"]) < whole["n_layer"] == extrapolated["n_layer"]
        assert {k: extrapolated[k] for k in BYTES} == {k: whole[k] for k in BYTES}
    if "exact_probe" in records:
        assert whole["largest_allgather_bytes"] > 0  # FSDP gathered (and freed in place): what the probes differ on
        assert {k: records["exact_probe"][k] for k in BYTES} == {k: whole[k] for k in BYTES}


@pytest.fixture(scope="module")
def fast_cases() -> dict:
    assert not torch.distributed.is_initialized()
    results = {case["name"]: run_case(case) for case in FAST}
    assert not torch.distributed.is_initialized()  # each fake process group was destroyed: nothing left for the next test
    return results


@pytest.mark.slow
@pytest.mark.parametrize("name", [c["name"] for c in FAST])
def test_extrapolated_rank_and_fast_probe_equal_the_whole_card_to_the_byte(fast_cases, name) -> None:
    _check(fast_cases[name])


@pytest.mark.slow
def test_extrapolated_rank_equals_the_whole_card_on_more_cards_and_strategies() -> None:
    results = _run(SLOW)
    for case in SLOW:
        _check(results[case["name"]])


def test_depths_keep_the_plan_of_the_card_and_stay_below_it() -> None:
    assert sample_depths(80, "full", 2) == [3, 4, 5, 6, 7]
    assert sample_depths(126, "none", 2) == [3, 4, 5, 6, 7]
    assert sample_depths(80, "every_k", 2) == [4, 6, 8, 10, 12]  # the card's residue mod k: block 79 not checkpointed
    assert sample_depths(81, "every_k", 2) == [5, 7, 9, 11, 13]
    assert sample_depths(80, "every_k", 3) == [8, 11, 14, 17, 20]  # 80 = 2 (mod 3)
    assert sample_depths(5, "full", 2) == []  # too shallow to gain anything: simulated whole
    assert sample_depths(6, "full", 2) == [3, 4, 5]


def _records(values_at: dict[int, int]) -> dict[int, dict[str, int]]:
    return {depth: {key: value + i for i, key in enumerate(LINEAR_KEYS)} for depth, value in values_at.items()}


def test_a_straight_line_is_extended_and_a_bent_one_is_not() -> None:
    line = line_through(_records({3: 100, 4: 150, 5: 200}), 80)
    assert line == {key: 3950 + i for i, key in enumerate(LINEAR_KEYS)} | {"peak_bytes": max(3950 + 1, 3950 + 3)}
    assert line_through(_records({3: 100, 4: 150, 5: 201}), 80) is None  # one byte off the line
    assert line_through(_records({3: 100, 4: 150}), 80) is None  # two points are no check
    assert line_through(_records({2: 1, 3: 100, 4: 150, 5: 200}), 80) is not None  # the last three decide
    assert line_through(_records({4: 100, 6: 150, 8: 200}), 81) is None  # 81 is not on the sampled residue
