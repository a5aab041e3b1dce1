"""The plugin's options in pytest: each ``OptionSpec`` of ``config.run_options`` becomes a ``--flashckpt-*`` flag with
an ini twin and a default shown in ``pytest --help``; a bad value is a ``pytest.UsageError`` naming the option and
the valid choices."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_flashckpt.config.run_options import OPTIONS, OptionError, Options, OptionSpec

__all__ = ["OPTIONS", "OptionSpec", "Options", "add_options", "options_from_config"]


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("flashckpt", "pytest-flashckpt: measure checkpointing strategies")
    group.addoption(
        "--flashckpt-suite",
        action="store",
        nargs="?",
        const="auto",  # resolved by config.suites.default_suite_for: gpu on CUDA, default on a CPU
        default=None,
        metavar="NAME|PATH",
        help="run a scenario suite (shipped name or YAML path; with no value: gpu on a CUDA device, default on a CPU: --flashckpt-suite=NAME)",
    )
    for spec in OPTIONS:
        kind = "store_true" if isinstance(spec.default, bool) else "store"
        extra = {} if kind == "store_true" else {"metavar": spec.name.split("-", 1)[1].upper()}
        group.addoption(spec.flag, action=kind, dest=spec.dest, default=None, help=f"{spec.help} (default: {spec.default})", **extra)
        parser.addini(spec.ini, f"{spec.help} (default: {spec.default})", default=None)


def options_from_config(config: pytest.Config) -> Options:
    """The typed options of this pytest run: a flag wins over its ini twin; a bad value is a usage error."""

    def lookup(spec: OptionSpec) -> tuple[Any, str]:
        raw = config.getoption(spec.dest)
        if raw is not None:
            return raw, spec.flag
        return config.getini(spec.ini), f"ini {spec.ini}"

    try:
        return Options.from_lookup(config.getoption("flashckpt_suite"), lookup)
    except OptionError as exc:
        raise pytest.UsageError(str(exc)) from None
