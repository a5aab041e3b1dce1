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


def import_circles(package: str = "pytest_flashckpt") -> tuple[int, list[list[str]]]:
    """(the number of modules of ``package``, every import of one of them that has a chain of imports back to it:
    the circle, importer first), from grimp's import graph (imports inside functions included)."""
    import grimp  # comes with import-linter (the test extra)

    graph = grimp.build_graph(package)
    modules = sorted(m for m in graph.modules if m.startswith(package + "."))
    circles = []
    for module in modules:
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module) if imported.startswith(package + ".") else None
            if back:
                circles.append([module, *back])
    return len(modules), circles


def test_no_import_circle_anywhere_in_the_package():
    """The layer contracts order the packages and the modules inside plugin/, core/, activation/ and simulate/;
    this finds a circle anywhere else too (two modules of one folder importing each other, as activation/budget's
    costs, runtime and solver and simulate's costs and step once did)."""
    modules, circles = import_circles()
    assert modules > 100  # the package was found: an empty graph has no circle either
    assert circles == []


def test_an_import_circle_is_found(tmp_path, monkeypatch):
    """The check can fail: a package whose two modules import each other is one circle, seen from either side."""
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from circled import b\n")
    (package / "b.py").write_text("from circled import a\n")
    (package / "c.py").write_text("from circled import a\n")  # imports into the circle, is not in it
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_circles("circled") == (3, [["circled.a", "circled.b", "circled.a"], ["circled.b", "circled.a", "circled.b"]])
