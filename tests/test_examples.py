"""The documented examples run and show what they claim."""

import runpy
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_any_module_example_every_strategy_bitwise_and_the_budget_plan_fits(capsys):
    results = runpy.run_path(str(EXAMPLES / "any_module.py"))["main"]()
    assert len(results) == 8
    assert all(row["bitwise"] for row in results.values()), results
    for key in ("budget (blocks=)", "budget (anatomy)"):
        assert results[key]["peak"] <= results[key]["budget"]
    # without an anatomy the planner has whole-block options only; with one it may save by role
    assert set(results["budget (blocks=)"]["options"]) <= {"none", "full"}
    assert "bitwise=True" in capsys.readouterr().out
