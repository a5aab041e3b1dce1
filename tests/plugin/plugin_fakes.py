"""A pytester folder's ``conftest.py`` that makes every pytest process of the run (a subprocess, pytest-xdist's
workers) measure through the shared ``FakeRunner`` (tests/conftest.py): for subprocess runs whose checks are about
scheduling, gathering or interruption, not about the numbers a training step gives."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

_HOOK = '''

def pytest_configure(config):
    import pytest_flashckpt.runner.suite as suite_module

    runner, before = FakeRunner(), suite_module.runner_for
    suite_module.runner_for = lambda scenario: runner
    config.add_cleanup(lambda: setattr(suite_module, "runner_for", before))
'''


def _class_source(cls: type) -> str:
    """``cls``'s source, found from the file of its methods' code: ``inspect.getsource`` looks the class up through
    ``sys.modules[cls.__module__]``, and every conftest of the test tree is a module named ``conftest``."""
    method = next(v for v in vars(cls).values() if inspect.isfunction(v))
    text = Path(method.__code__.co_filename).read_text(encoding="utf-8")
    (node,) = [n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
    return ast.get_source_segment(text, node)  # type: ignore[return-value]


def fake_runner_conftest(runner_class: type, extra: str = "") -> str:
    """The conftest's text: ``runner_class``'s source (the ``fake_runner`` fixture's type), a ``pytest_configure``
    that hands it every scenario, and ``extra`` (more hooks)."""
    return _class_source(runner_class) + "\n" + _HOOK + extra
