"""Source trees for an A/B run. A side is named one way or the other, never guessed from what exists on disk:

- ``--a REF`` / ``--b REF`` is always a git commit, branch or tag of the repository the command runs in, checked
  out with ``git worktree add --detach`` into a temporary folder (removed afterwards). A folder of the same name is
  never looked at: in a pull request's checkout a folder ``main/`` is the pull request's own code, and taking it
  for the branch ``main`` would let the pull request supply its own base.
- ``--a-path DIR`` / ``--b-path DIR`` is a folder holding the ``pytest_flashckpt`` package, run as it is,
  uncommitted changes included (``--b-path .`` measures the working tree).

Every side is checked before any worktree is made; one that names nothing usable is a RefError naming the option,
the value and the fix."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from pytest_flashckpt.ab.gitstate import FolderState, folder_state, git, repo_root

PACKAGE_MARK = Path("pytest_flashckpt") / "__init__.py"


class RefError(ValueError):
    """A side that names no commit or no tree; the message names the option and value and says what would work."""


@dataclass(frozen=True)
class Side:
    """One side as the user named it: ``option`` is ``--a``, ``--b`` (a git REF) or ``--a-path``, ``--b-path``."""

    option: str
    value: str

    @property
    def is_path(self) -> bool:
        return self.option.endswith("-path")


@dataclass(frozen=True)
class Tree:
    side: Side
    root: Path  # goes first on PYTHONPATH; each round runs here
    commit: str | None  # full SHA: the checked-out commit of a REF side, the folder's HEAD for a path side
    state: FolderState | None = None  # a path side's git state (None outside git, and for a REF side: a clean checkout)

    @property
    def label(self) -> str:
        return self.side.value


def resolve_ref(side: Side, repo: Path | None) -> str:
    """The full SHA ``side.value`` names in ``repo``; RefError when it names none, or more than one ref."""
    ref, option = side.value, side.option
    hint = (f"; a folder {ref!r} is here, but {option} never runs a folder: {option}-path {ref} does"
            if Path(ref).expanduser().is_dir() else f" (fetch it, or run a folder with {option}-path DIR)")
    if not ref or ref.startswith("-"):
        raise RefError(f"{option} {ref!r}: not a git ref (a ref cannot start with '-'){hint}")
    if repo is None:
        raise RefError(f"{option} {ref}: the current folder is in no git repository, so no commit can be resolved{hint}")
    found = git(["rev-parse", "--verify", "--end-of-options", f"{ref}^{{commit}}"], repo)
    if found.returncode != 0:
        raise RefError(f"{option} {ref}: no commit, branch or tag of that name in {repo}{hint}")
    if "ambiguous" in found.stderr:
        raise RefError(f"{option} {ref}: ambiguous in {repo} (a branch and a tag, or another ref, share the name); "
                       f"name one: refs/heads/{ref}, refs/tags/{ref}, or the commit's SHA")
    return found.stdout.strip()


def resolve_path(side: Side) -> Path:
    """The folder ``side.value`` names, resolved; RefError when it holds no ``pytest_flashckpt`` package."""
    folder = Path(side.value).expanduser()
    if not folder.is_dir():
        raise RefError(f"{side.option} {side.value}: no such folder (name a folder with pytest_flashckpt/ in it; "
                       f"a git commit, branch or tag is {side.option.removesuffix('-path')} REF)")
    if not (folder / PACKAGE_MARK).is_file():
        raise RefError(f"{side.option} {side.value}: the folder holds no pytest_flashckpt package (name the tree's "
                       "root, the folder with pytest_flashckpt/ in it)")
    return folder.resolve()


@contextlib.contextmanager
def checked_out(sides: Mapping[str, Side], start: Path, excluding: tuple[Path, ...] = ()) -> Iterator[dict[str, Tree]]:
    """The trees of ``sides`` (``"a"``/``"b"`` -> Side), every side checked before any worktree is made; REFs are
    resolved in the repository ``start`` is in, the temporary worktrees removed on the way out whatever happened.
    ``excluding``: paths a path side's uncommitted changes leave out (the job's own output folder)."""
    repo = repo_root(start)
    resolved = {name: (resolve_path(side), None) if side.is_path else (None, resolve_ref(side, repo))
                for name, side in sides.items()}
    made: list[Path] = []
    scratch = Path(tempfile.mkdtemp(prefix="flashckpt-ab-"))
    try:
        trees = {}
        for name, (folder, commit) in resolved.items():
            side = sides[name]
            if folder is not None:
                state = folder_state(folder, excluding)
                trees[name] = Tree(side, folder, state.head if state else None, state)
                continue
            where = scratch / name
            done = git(["worktree", "add", "--detach", str(where), commit], repo)  # type: ignore[arg-type]
            if done.returncode != 0:
                raise RefError(f"{side.option} {side.value}: git worktree add failed: {done.stderr.strip()}")
            made.append(where)
            if not (where / PACKAGE_MARK).is_file():
                raise RefError(f"{side.option} {side.value}: commit {commit} has no pytest_flashckpt package")
            trees[name] = Tree(side, where, commit)
        yield trees
    finally:
        for where in made:
            git(["worktree", "remove", "--force", str(where)], repo)  # type: ignore[arg-type]
        shutil.rmtree(scratch, ignore_errors=True)
