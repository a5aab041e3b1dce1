"""The committed sample report against a rendering of the committed ``reports/sample/results.json``.

Byte for byte, with one allowance: a table column the committed report does not have (a metric added since the
sample was measured, docs/architecture.md "How to add ... A metric") is tolerated when every one of its cells is
absent ("—": the committed results.json has no value for it). With those columns taken out, the rendering must equal
the committed report to the byte, so any change to an existing column, heading or line still fails. A column that
shows a value, a column the committed report has and the rendering lost, or a renamed header fails.
"""

from __future__ import annotations

import re

from pytest_flashckpt.report.format import MISSING

_CELL_BORDER = re.compile(r"(?<!\\)\|")  # a table cell's border; an escaped \| inside a cell is not one


def _blocks(text: str) -> list[str | list[str]]:
    """The text's lines, each run of table lines (starting with "|") gathered into one list."""
    blocks: list[str | list[str]] = []
    for line in text.split("\n"):
        if line.startswith("|"):
            if blocks and isinstance(blocks[-1], list):
                blocks[-1].append(line)
            else:
                blocks.append([line])
        else:
            blocks.append(line)
    return blocks


def _cells(line: str) -> list[str]:
    """A table line's pieces between borders: [before the first, cell 1, ..., after the last]."""
    return _CELL_BORDER.split(line)


def _without(line: str, columns: list[int]) -> str:
    pieces = _cells(line)
    return "|".join(p for i, p in enumerate(pieces) if i - 1 not in columns)


def _table_problem(rendered: list[str], committed: list[str], tolerated: list[str]) -> str | None:
    if rendered == committed:
        return None
    new_headers = [h.strip() for h in _cells(rendered[0])[1:-1]]
    old_headers = [h.strip() for h in _cells(committed[0])[1:-1]]
    extra = [i for i, h in enumerate(new_headers) if h not in old_headers]
    if [h for i, h in enumerate(new_headers) if i not in extra] != old_headers:
        return f"table headers changed: committed {old_headers}, rendered {new_headers}"
    for row in rendered[2:]:
        cells = [c.strip() for c in _cells(row)[1:-1]]
        shown = {new_headers[i]: cells[i] for i in extra if i < len(cells) and cells[i] != MISSING}
        if shown:
            return (f"new column(s) {sorted(shown)} show a value the committed sample cannot have ({shown} in "
                    f"{row.strip()[:80]!r}): regenerate reports/sample (docs/running.md)")
    stripped = [_without(line, extra) for line in rendered]
    for before, after in zip(committed, stripped):
        if before != after:
            return f"a table row changed:\n  committed: {before}\n  rendered:  {after}"
    if len(committed) != len(stripped):
        return f"the table has {len(stripped)} lines, the committed one {len(committed)}"
    tolerated += [f"{new_headers[i]!r} (table {old_headers[0]!r}...)" for i in extra]
    return None


def sample_problem(rendered: str, committed: str) -> tuple[str | None, list[str]]:
    """(what differs, or None; the new all-absent columns that were tolerated)."""
    tolerated: list[str] = []
    if rendered == committed:
        return None, tolerated
    new, old = _blocks(rendered), _blocks(committed)
    for n, (a, b) in enumerate(zip(new, old)):
        if isinstance(a, list) and isinstance(b, list):
            problem = _table_problem(a, b, tolerated)
            if problem:
                return problem, tolerated
        elif a != b:
            return f"block {n} changed:\n  committed: {b!r:.300}\n  rendered:  {a!r:.300}", tolerated
    if len(new) != len(old):
        return f"the rendering has {len(new)} blocks, the committed report {len(old)}", tolerated
    return None, tolerated
