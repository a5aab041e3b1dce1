"""What git says about a folder: the repository it is in, its HEAD commit (full SHA) and its uncommitted changes
(tracked edits and untracked files git does not ignore), so an A/B report can say exactly which code ran and which
did not."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence


def git(args: Sequence[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def repo_root(start: Path) -> Path | None:
    """The top of the git work tree ``start`` is in; None outside one (or without git)."""
    if not shutil.which("git") or not start.is_dir():
        return None
    found = git(["rev-parse", "--show-toplevel"], start)
    return Path(found.stdout.strip()).resolve() if found.returncode == 0 else None


def uncommitted(top: Path, excluding: Sequence[Path] = ()) -> tuple[str, ...]:
    """``git status --porcelain`` lines (``" M pytest_flashckpt/x.py"``, ``"?? new.py"``) of the work tree at
    ``top``; paths in ``excluding`` (the A/B job's own output folder) are left out by pathspec, so a job does not
    call its own earlier output a change."""
    exclude = []
    for path in excluding:
        resolved = path.resolve()
        if resolved.is_relative_to(top) and resolved != top:
            exclude.append(f":(top,exclude){resolved.relative_to(top).as_posix()}")
    found = git(["status", "--porcelain=v1", "-z", "--untracked-files=normal", "--", ".", *exclude], top)
    entries, tokens = [], iter(found.stdout.split("\0"))
    for token in tokens:
        if not token:
            continue
        entries.append(token)
        if token[:1] in ("R", "C"):  # a rename or copy: its source path follows as its own token
            next(tokens, None)
    return tuple(entries)


@dataclass(frozen=True)
class FolderState:
    """A folder's place in git: the work tree's top, its HEAD commit (None in a repository with no commit yet) and
    its uncommitted changes."""

    top: Path
    head: str | None
    changes: tuple[str, ...]

    def describe(self, limit: int = 5) -> str:
        head = f"HEAD `{self.head}`" if self.head else "no commit yet"
        if not self.changes:
            return f"{head}, no uncommitted changes"
        shown = ", ".join(f"`{c.strip()}`" for c in self.changes[:limit])
        more = f" and {len(self.changes) - limit} more" if len(self.changes) > limit else ""
        return f"{head} plus {len(self.changes)} uncommitted changes ({shown}{more})"


def folder_state(folder: Path, excluding: Sequence[Path] = ()) -> FolderState | None:
    """The git state of the work tree holding ``folder``; None when it is in no git repository."""
    top = repo_root(folder)
    if top is None:
        return None
    head = git(["rev-parse", "--verify", "--quiet", "HEAD^{commit}"], top)
    return FolderState(top, head.stdout.strip() or None, uncommitted(top, excluding))
