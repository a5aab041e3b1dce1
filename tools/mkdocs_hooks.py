"""mkdocs hooks: publish the generated reports beside the docs, so docs link to numbers instead of retyping them.

Pages in ``docs/`` link to generated files the way GitHub shows them, relative to the page
(``../reports/gate-power.md``, ``../baselines/README.md``). A link that leaves ``docs/`` is not a page to mkdocs,
so this hook adds the repository's generated reports (``reports/``), ``baselines/README.md`` and ``examples/`` to
the site under the same paths and rewrites such links to point at them. A link to a file that does not exist is
left as it is, so ``mkdocs build --strict`` fails on it.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

REPO = Path(__file__).resolve().parent.parent
PUBLISHED = ("reports", "baselines/README.md", "examples")  # repository paths the docs may link to
_OUTSIDE_LINK = re.compile(r"\]\(\.\./((?:reports|baselines|examples)/[^)#\s]+)(#[^)\s]*)?\)")


def _published_paths() -> list[str]:
    paths: list[str] = []
    for entry in PUBLISHED:
        path = REPO / entry
        if path.is_file():
            paths.append(entry)
        elif path.is_dir():
            paths.extend(p.relative_to(REPO).as_posix() for p in sorted(path.rglob("*")) if p.is_file())
    return paths


def on_files(files, config):
    for rel in _published_paths():
        if files.get_file_from_path(rel) is None:
            files.append(
                File(rel, str(REPO), config["site_dir"], config["use_directory_urls"], inclusion=InclusionLevel.NOT_IN_NAV)
            )
    return files


def on_page_markdown(markdown, page, config, files):
    depth = page.file.src_uri.count("/")  # pages in docs/ subfolders link one more level up

    def rewrite(match: re.Match) -> str:
        target, anchor = match.group(1), match.group(2) or ""
        if not (REPO / target).exists():
            return match.group(0)  # left broken: the strict build reports it
        return f"]({'../' * depth}{target}{anchor})"

    return _OUTSIDE_LINK.sub(rewrite, markdown)
