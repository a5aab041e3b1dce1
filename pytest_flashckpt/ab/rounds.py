"""The interleaved rounds of an A/B run: per round, the suite once per version, each in a fresh process
(``python -m pytest_flashckpt.cli run``) with ``PYTHONPATH`` at that version's tree, so each version's own code (and
the user's code in its tree) is what runs. The order alternates (A B, B A, ...) so a machine that slows down during
the job slows both alike. Every round's ``results.json`` is kept under the job's folder."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from pytest_flashckpt.ab.trees import Tree
from pytest_flashckpt.core.result import RunRecord
from pytest_flashckpt.config.record_file import read_record


class RoundError(RuntimeError):
    """A round's process failed (not a regression: it did not measure); the message has its output's tail."""


@dataclass
class Rounds:
    """Each version's runs, one RunRecord per round, in round order."""

    records: dict[str, list[RunRecord]] = field(default_factory=lambda: {"a": [], "b": []})


def command(suite: str, report: Path, extra: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "pytest_flashckpt.cli", "run", "--suite", suite, "--no-compare",
            "--report", str(report), *extra]


def run_once(tree: Tree, suite: str, report: Path, extra: Sequence[str], what: str) -> RunRecord:
    """The suite once, in a fresh process running ``tree``'s code; RoundError (naming ``what``) if it wrote nothing."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree.root), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.run(command(suite, report, extra), cwd=tree.root, env=env, capture_output=True, text=True)
    results = report / "results.json"
    if not results.is_file():
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise RoundError(f"{what} ({tree.label}): exit {proc.returncode}, no {results}:\n{tail}")
    return read_record(results)


def run_rounds(trees: dict[str, Tree], suite: str, rounds: int, out: Path, extra: dict[str, Sequence[str]],
               say: Callable[[str], None] = lambda text: None) -> Rounds:
    """``rounds`` rounds of ``suite`` (an absolute suite path) for versions ``a`` and ``b``; ``extra`` are further
    ``flashckpt run`` options per version (``--inject`` to check the gate)."""
    done = Rounds()
    for i in range(rounds):
        order = ("a", "b") if i % 2 == 0 else ("b", "a")
        for version in order:
            say(f"round {i + 1}/{rounds}: {version} ({trees[version].label})")
            record = run_once(trees[version], suite, out / f"round-{i + 1:02d}-{version}", extra.get(version, ()),
                              f"round {i + 1}, version {version}")
            done.records[version].append(record)
    return done
