"""Report tables: a short row ends in em dashes, a long one is refused, and every table of a report with skipped
scenarios has as many cells in each row as headers (so a column added to a section costs no dash count)."""

from __future__ import annotations

import re

import pytest
import report_synthetic as syn

from pytest_flashckpt.config.scenario import SaveConfig, Scenario
from pytest_flashckpt.report import render
from pytest_flashckpt.report.format import MISSING
from pytest_flashckpt.report.tables import table

CELL_BORDER = re.compile(r"(?<!\\)\|")


def test_a_short_row_ends_in_em_dashes() -> None:
    lines = table([["a"], ["b", "c"]], ["x", "y"]).splitlines()
    assert [c.strip() for c in CELL_BORDER.split(lines[2])[1:-1]] == ["a", MISSING]  # tabulate alone leaves it blank


def test_a_row_longer_than_the_headers_is_refused() -> None:
    with pytest.raises(ValueError, match=r"a table row has 3 cells for 2 headers \(x, y\): \['a', 'b', 'c'\]"):
        table([["a", "b", "c"]], ["x", "y"])


def test_every_row_of_every_table_is_whole_with_skipped_scenarios() -> None:
    skipped_save = syn.result(Scenario(name="save-skipped", suite="synthetic", save=SaveConfig(strategy="async")),
                              status="skipped", reason="SYNTHETIC-SKIP no disk")
    text = render(syn.record([*syn.results(), skipped_save]))
    assert "SYNTHETIC-SKIP no disk" in text and "SYNTHETIC-SKIP offload" in text  # the skipped rows are shown
    tables = 0
    for block in re.findall(r"(?:^\|.*\n)+", text, flags=re.M):
        rows = [CELL_BORDER.split(line)[1:-1] for line in block.splitlines()]
        tables += 1
        for row in rows:
            assert len(row) == len(rows[0]) and all(cell.strip() for cell in row), (rows[0], row)
    assert tables >= 5
