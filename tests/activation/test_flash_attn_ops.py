"""flash-attn as selective_op and kernel detection see it, and dropout under selective_op, proved on CPU with fake
flash-attn packages that model the real ones: 2.7+ registers ``flashattn::_flash_attn_forward`` (a custom op with a
``dropout_p`` argument that draws its mask inside, opaque to checkpointing) when imported; 2.5 / 2.6 compute behind a
Python call the dispatcher never sees. Each version runs in a fresh interpreter (custom ops are process-wide); the
two 2.7 cases share one (the fake op is registered once, at import, and serves both)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fresh_python import run_together

from pytest_flashckpt.activation.ops import consumes_rng

CHECK = Path(__file__).parent / "fake_flash_attn" / "check.py"


# case name -> (version, the check.py case); one interpreter per version, its cases run in this order
CASES = {"v27": ("v27", "fixed"), "v27-save-random": ("v27", "save-random-ops"), "v25": ("v25", "fixed")}


@pytest.fixture(scope="module")
def checks() -> dict[str, dict]:
    """The three cases' results by name, from one fresh interpreter per version, started together."""
    versions: dict[str, list[str]] = {}
    for version, case in CASES.values():
        versions.setdefault(version, []).append(case)
    results = run_together({version: (CHECK, version, *cases) for version, cases in versions.items()})
    return {name: results[version][case] for name, (version, case) in CASES.items()}


@pytest.mark.slow
def test_flash_attn_27_ops_are_looked_up_after_import_saved_and_detected(checks):
    result = checks["v27"]
    assert not result["listed_before_import"]  # not registered until flash_attn is imported ...
    assert "flashattn._flash_attn_forward.default" in result["save_ops"]  # ... which selective_op now does first
    assert result["matched"]["flashattn._flash_attn_forward.default"] == 2  # one per block
    assert result["kernel"] == "flash_attn"


@pytest.mark.slow
def test_selective_op_with_dropout_gives_the_gradients_of_no_checkpointing_bit_for_bit(checks):
    fixed = checks["v27"]
    assert fixed["loss_equal"] and fixed["grads_equal"]


@pytest.mark.slow
def test_saving_a_random_attention_op_would_shift_the_later_dropout_masks(checks):
    """The failure the policy prevents, reproduced: the saved attention is replayed without drawing its mask, so
    the residual dropout after it draws another one and the gradients differ (the loss, from the forward, does not)."""
    broken = checks["v27-save-random"]
    assert broken["loss_equal"] and not broken["grads_equal"]


@pytest.mark.slow
def test_flash_attn_25_has_no_op_to_save_but_is_detected_by_its_python_call(checks):
    result = checks["v25"]
    assert result["kernel"] == "flash_attn"  # not "unknown (flash_attn)"
    assert not any("flash" in op and "scaled_dot" not in op for op in result["save_ops"])
    assert result["grads_equal"]


def test_rng_use_is_read_from_the_call_not_the_op_tag():
    aten = torch.ops.aten
    assert consumes_rng(aten._scaled_dot_product_flash_attention.default, (1, 2, 3, 0.1), {})
    assert not consumes_rng(aten._scaled_dot_product_flash_attention.default, (1, 2, 3), {})  # tagged random, p=0
    assert consumes_rng(aten._scaled_dot_product_efficient_attention.default, (1, 2, 3, None, True), {"dropout_p": 0.2})
    assert consumes_rng(aten._scaled_dot_product_cudnn_attention.default, (1, 2, 3, None, True, 0.1), {})
    assert consumes_rng(aten.native_dropout.default, (1, 0.1, True), {})
    assert not consumes_rng(aten.mm.default, (1, 2), {})
