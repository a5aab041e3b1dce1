"""No import circle among the modules of ``activation/``: every pair of its modules is connected one way at most
(the layer contracts in pyproject.toml order the packages; inside the package this order is kept by hand:
``ops``, ``options`` > ``policy``, ``blocks`` > ``wrapper`` > ``budget/`` > ``plan`` > ``applied`` > ``apply``)."""

from __future__ import annotations

import itertools

import grimp  # comes with import-linter (the test extra)


def circles(package: str) -> list[str]:
    graph = grimp.build_graph("pytest_flashckpt")
    modules = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    found = []
    for a, b in itertools.combinations(modules, 2):
        there, back = graph.find_shortest_chain(a, b), graph.find_shortest_chain(b, a)
        if there and back:
            found.append(" -> ".join(there) + "  and back: " + " -> ".join(back[1:]))
    assert len(modules) > 5, modules  # the package was found
    return found


def test_no_import_circle_in_activation():
    assert circles("pytest_flashckpt.activation") == []
