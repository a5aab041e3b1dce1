"""The pytest face of pytest-flashckpt: hooks, options, the suite as test items, the ``flashckpt`` fixture.

Everything below this package is a pytest-free library (``pyproject.toml``'s import contracts; docs/architecture.md).
Importing this package imports neither torch nor the library: the entry point is ``pytest_flashckpt.plugin.hooks``.
"""
