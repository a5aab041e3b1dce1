"""The pytest plugin (entry point ``pytest11: flashckpt``): a thin layer of hooks.

Without ``--flashckpt-suite`` it only adds its options and markers; it imports neither torch nor the
measurement library, so a project that merely has the plugin installed pays nothing for it.
"""

from __future__ import annotations

import pytest

from pytest_flashckpt.options import Options, add_options


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "flashckpt(**budgets): measurement budgets for the flashckpt fixture")
    if config.getoption("flashckpt_suite") is None:
        return
    options = Options.from_config(config)
    from pytest_flashckpt.suite_session import SuiteSession  # imports torch: only when a suite is asked for

    config.pluginmanager.register(SuiteSession.start(config, options), "flashckpt-suite-session")
