"""Which suite file an A/B run gates on, and where it came from.

``--suite-from a`` (the default) reads it from side A's tree: a NAME is ``suites/NAME.yaml`` there (an installed
tree's ``pytest_flashckpt/_data/suites/``), a PATH is relative to A's root. A pull request is side B, and in CI the
command itself often runs in the pull request's checkout, so resolving the suite there would let the pull request
pick what it is judged on (drop the scenario it slows down). ``--suite-from here`` takes the suite as this command
resolves it (its own install's shipped suites, or a path from the current folder), for local runs of a suite file
that is in neither tree.

A suite with ``include:`` is refused under ``--suite-from a``: each side's own code resolves the included names from
its own tree, so B's tree would supply those scenarios."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_flashckpt.ab.gitstate import folder_state
from pytest_flashckpt.ab.trees import Tree
from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.suites import Suite, load_suite
from pytest_flashckpt.core.files import shown_path

SUITE_FROM = ("a", "here")
_SUITE_FOLDERS = (Path("suites"), Path("pytest_flashckpt") / "_data" / "suites")


@dataclass(frozen=True)
class SuiteSource:
    suite: Suite  # loaded and checked; ``suite.path`` (absolute) is what both sides' rounds run
    shown: str  # the file as ab.md names it: relative to A's root, or as this command found it
    origin: str  # "A's tree" or "this command's install / current folder"
    commit: str | None  # the commit the file's tree is at, when it is in git
    dirty: bool = False  # that tree has uncommitted changes (the file may be one of them)

    def describe(self) -> str:
        commit = f", commit `{self.commit}`" if self.commit else ", in no git commit"
        return f"suite `{self.suite.name}` from `{self.shown}` of {self.origin}{commit}" + (
            " plus uncommitted changes" if self.dirty else "")


def _in_tree(name_or_path: str, tree: Tree) -> Path:
    root = tree.root.resolve()
    candidate = Path(name_or_path)
    if candidate.suffix in {".yaml", ".yml"} or candidate.parent != Path("."):
        if candidate.is_absolute():
            raise ConfigError("--suite", f"{name_or_path}: an absolute path is no file of A's tree",
                              "give a path relative to A's root (suites/ab.yaml), or --suite-from here for a file of this machine")
        path = (root / candidate).resolve()
        if not path.is_relative_to(root):
            raise ConfigError("--suite", f"{name_or_path}: leads out of A's tree ({root})", "give a path inside A's tree")
        if not path.is_file():
            raise ConfigError("--suite", f"{name_or_path}: no such file in A's tree ({tree.label})",
                              "give a path relative to A's root, or --suite-from here")
        return path
    for folder in _SUITE_FOLDERS:
        if (root / folder / f"{name_or_path}.yaml").is_file():
            return root / folder / f"{name_or_path}.yaml"
    names = sorted({p.stem for folder in _SUITE_FOLDERS for p in (root / folder).glob("*.yaml")})
    raise ConfigError("--suite", f"unknown suite {name_or_path!r} in A's tree ({tree.label})",
                      f"A's suites: {', '.join(names) or 'none'}; or a path relative to A's root")


def from_side_a(name_or_path: str, tree: Tree) -> SuiteSource:
    """The suite ``name_or_path`` names in A's tree, loaded and checked; ConfigError naming ``--suite`` otherwise."""
    path = _in_tree(name_or_path, tree)
    shown = path.relative_to(tree.root.resolve()).as_posix()
    try:
        suite = _load(str(path))
    except ConfigError as exc:  # name the file as it is in A's tree, not the temporary worktree that is removed
        where = f"{shown} of A's tree ({tree.side.option} {tree.label})" if exc.where == shown_path(path) else exc.where
        raise ConfigError(where, exc.problem, exc.fix, scenario=exc.scenario, key=exc.key) from None
    if any(origin != shown_path(suite.path) for origin in suite.origins.values()):
        raise ConfigError(shown, "has include:, whose suites each side's own code resolves from its own tree (B's "
                          "tree would supply them)", "write the scenarios into this one file, or --suite-from here")
    dirty = tree.state is not None and bool(tree.state.changes)
    return SuiteSource(suite, shown, f"A's tree ({tree.side.option} {tree.label})", tree.commit, dirty)


def from_here(name_or_path: str) -> SuiteSource:
    """The suite as this command resolves it (``config.suites.load_suite``), with its folder's commit if any."""
    suite = _load(name_or_path)
    state = folder_state(suite.path.resolve().parent)
    return SuiteSource(suite, str(suite.path.resolve()), "this command's install or current folder (--suite-from here)",
                       state.head if state else None, bool(state and state.changes))


def _load(name_or_path: str) -> Suite:
    try:
        return load_suite(name_or_path)
    except ConfigError as exc:  # a problem with no file is the option's: an unknown suite name
        raise (exc if exc.where else exc.within("--suite")) from None
