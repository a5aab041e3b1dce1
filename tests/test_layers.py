"""The layer contracts of ``[tool.importlinter]`` (pyproject.toml; docs/architecture.md): an import that points up
a layer fails here, and the message names it (``a is not allowed to import b: a -> b (l.N)``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_layer_contracts_hold():
    if importlib.util.find_spec("importlinter") is None:
        pytest.fail("import-linter is not installed: install the test extra, pip install -c constraints.txt -e '.[test]'")
    run = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()",
         "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    out = run.stdout + run.stderr
    broken = out[out.find("Broken contracts"):] if "Broken contracts" in out else out
    assert run.returncode == 0, f"an import breaks the layer contracts in pyproject.toml [tool.importlinter]:\n{broken}"
    assert "BROKEN" not in out
