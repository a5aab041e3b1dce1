"""The pytest plugin (entry point ``pytest11: flashckpt``): a thin layer of hooks.

Without ``--flashckpt-suite`` it only adds its options, the ``flashckpt`` marker and the ``flashckpt`` fixture;
it imports neither torch nor the measurement library (the fixture imports torch when ``measure`` is called), so
a project that merely has the plugin installed pays nothing for it.
"""

from __future__ import annotations

import pytest

from pytest_flashckpt.plugin.marker_budgets import SPECS, BudgetError, parse_budgets, violations
from pytest_flashckpt.plugin.fixture import flashckpt  # noqa: F401  (the fixture, registered with the plugin)
from pytest_flashckpt.plugin.options import add_options, options_from_config
from pytest_flashckpt.runner.threads import prefer_passive_openmp

MARKER = "flashckpt"


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """A suite run's OpenMP threads wait passively (``runner.threads``): set before the project's conftest files
    (which may import torch) are loaded, the earliest hook an installed plugin gets."""
    if getattr(early_config.known_args_namespace, "flashckpt_suite", None) is not None:
        prefer_passive_openmp()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}({'=..., '.join(SPECS)}=...): budgets checked against what the flashckpt fixture measured, "
        "e.g. @pytest.mark.flashckpt(max_peak_memory='2 GiB', max_overhead=1.3, max_save_stall='50 ms')",
    )
    options = options_from_config(config)  # validated on every run: a bad value is a usage error
    if options.suite is None:
        return
    from pytest_flashckpt.plugin.session import SuiteSession  # imports torch: only when a suite is asked for

    config.pluginmanager.register(SuiteSession.start(config, options), "flashckpt-suite-session")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A marker's budgets are validated before the test runs, and need the fixture that measures them."""
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return
    try:
        parse_budgets(marker.args, marker.kwargs)
        problem = None
    except BudgetError as exc:
        problem = str(exc)
    if problem is not None:  # failed outside the except block: no "during handling of the above exception" line
        pytest.fail(problem, pytrace=False)
    if MARKER not in getattr(item, "fixturenames", ()):
        pytest.fail(
            "@pytest.mark.flashckpt budgets are checked against the flashckpt fixture: add `flashckpt` to the test's "
            "arguments and call flashckpt.measure(step, ...)",
            pytrace=False,
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """After a passing test body, fail the test when a measurement broke one of the marker's budgets."""
    result = yield
    marker = item.get_closest_marker(MARKER)
    fixture = getattr(item, "funcargs", {}).get(MARKER) if marker is not None else None
    measurements = getattr(fixture, "measurements", None)  # None: the test overrode the fixture with its own
    if marker is not None and measurements is not None:
        problems = violations(parse_budgets(marker.args, marker.kwargs), [m.as_dict() for m in measurements])
        if problems:
            pytest.fail("flashckpt budget exceeded:\n  " + "\n  ".join(problems), pytrace=False)
    return result
