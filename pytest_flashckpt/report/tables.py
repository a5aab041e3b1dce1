"""Markdown tables and footnotes. A table cell is never empty: a missing value is an em dash, a skipped
scenario is ``skipped [n]`` with the reason as footnote ``n`` under the table."""

from __future__ import annotations

from tabulate import tabulate

from pytest_flashckpt.report.format import MISSING


def table(rows: list[list[str]], headers: list[str]) -> str:
    """A GitHub markdown table; cells are already formatted strings (no number re-parsing). A row shorter than the
    headers ends in em dashes (a skipped scenario's row names what it has; a column added to a section's headers
    needs no count of dashes kept in step); a longer one is an error naming it."""
    for row in rows:
        if len(row) > len(headers):
            raise ValueError(f"a table row has {len(row)} cells for {len(headers)} headers ({', '.join(headers)}): {row}")
    clean = [[cell if cell not in (None, "") else MISSING for cell in row] + [MISSING] * (len(headers) - len(row))
             for row in rows]
    return tabulate(clean, headers=headers, tablefmt="github", disable_numparse=True)


def escape(text: str) -> str:
    """Keep a free-text reason from breaking a table row."""
    return text.replace("|", "\\|").replace("\n", " ")


class Footnotes:
    """Collects reasons (skip messages) and numbers them; the same reason gets the same number."""

    def __init__(self) -> None:
        self._reasons: list[str] = []

    def mark(self, reason: str) -> str:
        reason = escape(reason)
        if reason not in self._reasons:
            self._reasons.append(reason)
        return f"[{self._reasons.index(reason) + 1}]"

    def skipped(self, status: str, reason: str | None) -> str:
        return f"{status} {self.mark(reason or 'no reason given')}"

    def lines(self) -> list[str]:
        if not self._reasons:
            return []
        return ["", *(f"[{i}] {reason}  " for i, reason in enumerate(self._reasons, 1))]
