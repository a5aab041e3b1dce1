"""The documented examples run and show what they claim."""

import runpy
from pathlib import Path

import pytest
import torch

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.config.scenario import ActivationConfig

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _example() -> dict:
    return runpy.run_path(str(EXAMPLES / "any_module.py"))


@pytest.mark.parametrize("with_anatomy", [False, True])
@pytest.mark.parametrize("strategy", ["full", "selective_op"])
def test_any_module_strategies_give_bitwise_gradients(strategy, with_anatomy):
    """The example's model (blocks under ``layers``, a keyword argument per block) without and with an anatomy."""
    example = _example()
    reference_loss, reference = example["gradients"](example["build"](with_anatomy))
    model = example["build"](with_anatomy)
    apply_ac(model, ActivationConfig(strategy=strategy), blocks=None if with_anatomy else "layers")
    loss, grads = example["gradients"](model)
    assert torch.equal(loss, reference_loss)
    assert all(torch.equal(grads[name], reference[name]) for name in reference)


@pytest.mark.slow
def test_any_module_example_every_strategy_bitwise_and_the_budget_plan_fits(capsys):
    results = _example()["main"]()
    assert len(results) == 8
    assert all(row["bitwise"] for row in results.values()), results
    for key in ("budget (blocks=)", "budget (anatomy)"):
        assert results[key]["peak"] <= results[key]["budget"]
    # without an anatomy the planner has whole-block options only; with one it may save by role
    assert set(results["budget (blocks=)"]["options"]) <= {"none", "full"}
    assert "bitwise=True" in capsys.readouterr().out
