"""Copy the article's scenario table from the committed sample report into README (between the excerpt markers).

README shows a real report, never a typed one: ``python tools/readme_excerpt.py`` rewrites the excerpt from
``reports/sample/flashckpt-report.md``; ``tests/test_docs.py`` fails when the two differ (``--check`` does the same
here, exit 1).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
SAMPLE = REPO / "reports" / "sample" / "flashckpt-report.md"
START, END = "<!-- excerpt:start -->", "<!-- excerpt:end -->"
SECTION = "## The article's scenario table, measured"


def excerpt(report: str) -> str:
    """The first table under the article's section of a report, as its markdown lines."""
    if SECTION not in report:
        raise SystemExit(f"{SAMPLE}: no section {SECTION!r}; regenerate the sample report")
    lines = report.split(SECTION, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def render(readme: str, table: str) -> str:
    if START not in readme or END not in readme:
        raise SystemExit(f"{README}: the markers {START} and {END} are missing")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table}\n{END}{tail}"


def main(argv: list[str]) -> int:
    readme = README.read_text(encoding="utf-8")
    new = render(readme, excerpt(SAMPLE.read_text(encoding="utf-8")))
    if "--check" in argv:
        return 0 if new == readme else 1
    README.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
