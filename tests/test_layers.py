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


def import_circles(package: str = "pytest_flashckpt") -> list[list[str]]:
    """Every set of modules of ``package`` that import each other round a circle (the strongly connected components
    of more than one module of its import graph, imports inside functions included: grimp sees them)."""
    import grimp  # comes with import-linter (the test extra)

    graph = grimp.build_graph(package)
    modules = sorted(m for m in graph.modules if m.startswith(package + "."))
    edges = {m: sorted(d for d in graph.find_modules_directly_imported_by(m) if d.startswith(package + ".")) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm; the graph is a few hundred modules deep at most
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in edges.get(module, ()):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in modules:
        if module not in index:
            visit(module)
    assert len(modules) > 100, modules  # the package was found
    return circles


def test_no_import_circle_anywhere_in_the_package():
    """The layer contracts order the packages and the modules inside plugin/, core/, activation/ and simulate/;
    this finds a circle anywhere else too (two modules of one folder importing each other, as activation/budget's
    costs, runtime and solver and simulate's costs and step once did)."""
    assert import_circles() == []


def test_an_import_circle_is_found(tmp_path, monkeypatch):
    """The check can fail: a package whose two modules import each other is one circle."""
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from circled import b\n")
    (package / "b.py").write_text("from circled import a\n")
    for n in range(101):  # the helper insists on a package of real size
        (package / f"m{n}.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_circles("circled") == [["circled.a", "circled.b"]]
