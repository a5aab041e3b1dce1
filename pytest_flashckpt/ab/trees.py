"""Source trees for an A/B run: a REF is a folder holding the ``pytest_flashckpt`` package (an installed or
checked-out tree, the user's own training code beside it), or a git commit / branch / tag of the repository the
command runs in, checked out with ``git worktree add --detach`` into a temporary folder and removed afterwards.
A REF that is neither is an error naming it, before anything runs."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator


class RefError(ValueError):
    """A REF that names no tree and no commit; the message names it and says what would work."""


@dataclass(frozen=True)
class Tree:
    ref: str  # as the user wrote it
    root: Path  # goes first on PYTHONPATH
    commit: str | None  # resolved commit, for a git REF


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def repo_root(start: Path) -> Path | None:
    found = _git(["rev-parse", "--show-toplevel"], start) if shutil.which("git") else None
    return Path(found.stdout.strip()) if found is not None and found.returncode == 0 else None


def resolve(ref: str, repo: Path | None, option: str) -> tuple[Path | None, str | None]:
    """(folder, None) for a tree REF, (None, commit) for a git REF; RefError otherwise."""
    folder = Path(ref).expanduser()
    if folder.is_dir():
        if not (folder / "pytest_flashckpt" / "__init__.py").is_file():
            raise RefError(f"{option} {ref}: the folder holds no pytest_flashckpt package (name the tree's root, "
                           "the folder with pytest_flashckpt/ in it)")
        return folder.resolve(), None
    if repo is None:
        raise RefError(f"{option} {ref}: not a folder, and not inside a git repository to resolve it as a commit")
    found = _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], repo)
    if found.returncode != 0:
        raise RefError(f"{option} {ref}: neither a folder nor a commit, branch or tag of {repo} "
                       "(git rev-parse found nothing; fetch it, or name a checked-out tree)")
    return None, found.stdout.strip()


@contextlib.contextmanager
def checked_out(refs: dict[str, str], start: Path) -> Iterator[dict[str, Tree]]:
    """The trees of ``refs`` (option name -> REF), every REF checked before any worktree is made; the temporary
    worktrees are removed on the way out, whatever happened."""
    repo = repo_root(start)
    resolved = {option: resolve(ref, repo, option) for option, ref in refs.items()}
    made: list[Path] = []
    scratch = Path(tempfile.mkdtemp(prefix="flashckpt-ab-"))
    try:
        trees = {}
        for option, (folder, commit) in resolved.items():
            if folder is None:
                where = scratch / option.strip("-")
                done = _git(["worktree", "add", "--detach", str(where), commit], repo)  # type: ignore[arg-type]
                if done.returncode != 0:
                    raise RefError(f"{option} {refs[option]}: git worktree add failed: {done.stderr.strip()}")
                made.append(where)
                folder = where
            trees[option] = Tree(refs[option], folder, commit)
        yield trees
    finally:
        for where in made:
            _git(["worktree", "remove", "--force", str(where)], repo)  # type: ignore[arg-type]
        shutil.rmtree(scratch, ignore_errors=True)
