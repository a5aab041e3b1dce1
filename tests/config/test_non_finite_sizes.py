"""A size or budget that is not a finite number ('1e400 GiB', NaN) is a one-line ValueError naming the value, on
every path that reads sizes (a suite's activation.budget, ``flashckpt simulate --device-memory`` / ``--budget``).
Control: the float such a size becomes cannot be made bytes (an OverflowError, which no front end catches)."""

from __future__ import annotations

import math

import pytest

from pytest_flashckpt.cli import main
from pytest_flashckpt.config.budget import BudgetSpec
from pytest_flashckpt.core.units import parse_size


@pytest.mark.parametrize("value", ["1e400 GiB", "1e400", float("nan"), float("inf")])
def test_a_size_that_is_not_finite_is_refused_naming_it(value):
    with pytest.raises(ValueError, match="is not a finite size"):
        parse_size(value)


def test_control_the_overflowing_size_is_not_a_value_error():
    assert math.isinf(float("1e400") * 2**30)
    with pytest.raises(OverflowError):
        int(round(float("1e400") * 2**30))


def test_a_budget_of_1e400_gib_is_a_config_line_not_a_traceback():
    with pytest.raises(ValueError, match=r"activation\.budget: .*'1e400 GiB' is not a finite size"):
        BudgetSpec.parse("1e400 GiB")


@pytest.mark.parametrize("argv", [["--device-memory", "1e400GiB"], ["--budget", "1e400 GiB"]])
def test_simulate_refuses_a_size_that_is_not_finite_with_exit_2(capsys, argv):
    assert main(["simulate", "--model", "tiny", "--seq", "64", "--batch", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert "is not a finite size" in err and err.count("\n") == 1 and "Traceback" not in err
