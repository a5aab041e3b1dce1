"""Budgets of ``@pytest.mark.flashckpt(...)``: parsed once, checked against what the ``flashckpt`` fixture measured.

    @pytest.mark.flashckpt(max_peak_memory="2 GiB", max_overhead=1.3, max_save_stall="50 ms")

Each key names the metric it bounds (the key is declared with the metric in ``pytest_flashckpt.core.metrics``); a wrong key or value is an error naming the valid keys and formats, so a
typo never turns a budget into silently no budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from pytest_flashckpt.core.metrics import BUDGETS, METRICS
from pytest_flashckpt.core.numbers import mib
from pytest_flashckpt.core.units import DURATION_FORMATS, SIZE_FORMATS, parse_duration, parse_size


class BudgetError(ValueError):
    """A marker with an unknown key or a value that is not in the key's format."""


def _ratio(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{value!r} is not a number")
    number = float(value)
    if number <= 0:
        raise ValueError(f"{value!r} must be positive")
    return number


def _fraction(value: Any) -> float:
    number = _ratio(value)
    if number >= 1:
        raise ValueError(f"{value!r} must be a fraction below 1, e.g. 0.3 for 30%")
    return number


@dataclass(frozen=True)
class MarkerBudget:
    """One key of the ``flashckpt`` marker (``max_peak_memory=...``): the metric it bounds and how its value is
    written (not ``config.budget.BudgetSpec``, an activation-memory budget of a suite scenario)."""

    key: str
    metric: str  # the metric it bounds (pytest_flashckpt.core.metrics; a field of the fixture's Measurement)
    parse: Callable[[Any], float]
    formats: str
    upper: bool = True  # True: measured must be <= budget; False: measured must be >= budget
    needs: str = ""  # what measure() must be given for the metric to exist

    def show(self, value: float) -> str:
        unit = METRICS[self.metric].unit
        if unit == "B":
            return mib(value)
        if unit == "s":
            return f"{value * 1e3:,.2f} ms"  # budgets are often a few ms: two decimals, never switched to s
        return f"{value:.3f}"


# how a budget's value is written, per unit of the metric it bounds
_PARSERS: dict[str, tuple[Callable[[Any], float], str]] = {
    "B": (parse_size, SIZE_FORMATS),
    "s": (parse_duration, DURATION_FORMATS),
    "ratio": (_ratio, "a positive ratio to the reference step time, e.g. 1.3"),
    "fraction": (_fraction, "a fraction in (0, 1), e.g. 0.3"),
}

SPECS: dict[str, MarkerBudget] = {
    key: MarkerBudget(key, m.name, *_PARSERS[m.unit], upper=m.worse == "higher", needs=m.needs)
    for key, m in BUDGETS.items()
}


def parse_budgets(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, float]:
    """Validated budgets from a marker's arguments; BudgetError names the valid keys and the key's format."""
    valid = ", ".join(SPECS)
    if args:
        raise BudgetError(f"@pytest.mark.flashckpt takes keyword budgets only (valid keys: {valid}), got positional {args!r}")
    if not kwargs:
        raise BudgetError(f"@pytest.mark.flashckpt needs at least one budget; valid keys: {valid}")
    budgets = {}
    for key, raw in kwargs.items():
        spec = SPECS.get(key)
        if spec is None:
            raise BudgetError(f"@pytest.mark.flashckpt: unknown budget {key!r}; valid keys: {valid}")
        try:
            budgets[key] = spec.parse(raw)
        except ValueError as exc:
            reason = str(exc)  # units' messages already end with the expected formats: say them once
            expected = "" if spec.formats in reason else f"; expected {spec.formats}"
            raise BudgetError(f"@pytest.mark.flashckpt({key}={raw!r}): {reason}{expected}") from None
    return budgets


def violations(budgets: Mapping[str, float], measurements: list[Mapping[str, Any]]) -> list[str]:
    """One line per budget broken by any measurement (or that no measurement could check)."""
    if not measurements:
        return ["@pytest.mark.flashckpt budgets were set but flashckpt.measure(...) was never called"]
    problems = []
    for key, limit in budgets.items():
        spec = SPECS[key]
        for index, measured in enumerate(measurements):
            label = measured.get("name") or f"measurement {index + 1}"
            value = measured.get(spec.metric)
            if value is None:
                hint = f" (pass {spec.needs} to flashckpt.measure)" if spec.needs else ""
                problems.append(f"{key}: {label} has no {spec.metric}{hint}")
            elif (value > limit) if spec.upper else (value < limit):
                relation = "above" if spec.upper else "below"
                problems.append(f"{key}: {label} {spec.metric} = {spec.show(value)} is {relation} the budget {spec.show(limit)}")
    return problems
