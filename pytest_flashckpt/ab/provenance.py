"""What an A/B report says about what ran: both sides (full SHAs; a folder, its HEAD and uncommitted changes), the
repository's own uncommitted changes when no side measured them, and each side's recorded profile and versions
from its rounds' ``results.json``. Two sides measured on different profiles are not comparable: ``profile_mismatch``
names the first difference and the command refuses a verdict."""

from __future__ import annotations

import platform
import sys

from tabulate import tabulate

from pytest_flashckpt.ab.gitstate import FolderState
from pytest_flashckpt.ab.rounds import Rounds
from pytest_flashckpt.ab.trees import Tree
from pytest_flashckpt.core.result import RunRecord

SIDES = ("a", "b")


def describe_tree(tree: Tree) -> str:
    if not tree.side.is_path:
        return f"commit `{tree.commit}`, checked out clean into a temporary worktree"
    where = f"folder `{tree.root}`"
    if tree.state is None:
        return f"{where} (in no git repository: no commit to name), run as it is"
    inside = "" if tree.state.top == tree.root else f" (in the work tree `{tree.state.top}`)"
    return f"{where}{inside}: {tree.state.describe()}; run as it is, uncommitted changes included"


def sides_table(trees: dict[str, Tree]) -> str:
    rows = [[name.upper(), f"`{tree.side.option} {tree.label}`", describe_tree(tree)] for name, tree in trees.items()]
    return tabulate(rows, headers=["side", "named as", "what ran"], tablefmt="github")


def unmeasured_changes(repo: FolderState | None, trees: dict[str, Tree]) -> str | None:
    """A warning when the repository the REFs come from has uncommitted changes that no side ran: a REF side is a
    clean checkout of a commit, so ``--a HEAD --b HEAD`` with an edit compares committed code with itself."""
    if repo is None or not repo.changes:
        return None
    if any(t.side.is_path and t.state is not None and t.state.top == repo.top for t in trees.values()):
        return None  # a path side is that work tree: its changes were measured (and named in the sides table)
    if all(t.side.is_path for t in trees.values()):
        return None
    return (f"The working tree `{repo.top}` ({repo.describe()}) was NOT measured: REF sides are commits, checked out clean. "
            "To measure the working tree, name it as a side: `--b-path .`.")


def _value(record: RunRecord, field: str):
    if field == "profile id":
        return record.profile_id
    if field == "pytest-flashckpt":
        return record.tool_version or None
    if field == "recorded commit":
        return record.commit
    return record.profile.get(field)


_FIELDS = ("profile id", "device_type", "device_name", "device_count", "cpu_threads", "torch", "cuda", "flash_attn",
           "kernel", "machine", "pytest-flashckpt", "recorded commit")


def _side_value(records: list[RunRecord], field: str) -> str:
    seen = list(dict.fromkeys(str(_value(r, field)) for r in records))
    return "(no rounds)" if not seen else seen[0] if len(seen) == 1 else "varies: " + ", ".join(seen)


def versions_table(rounds: Rounds) -> str:
    """Per recorded field (profile id, device, torch, CUDA, flash-attn, kernel, tool version, commit), A's and B's
    value over their rounds ("varies: ..." when a side's rounds differ)."""
    rows = [[field, *(_side_value(rounds.records[s], field) for s in SIDES)] for field in _FIELDS]
    python = f"Python {platform.python_version()} (`{sys.executable}`), the one interpreter both sides' rounds ran under"
    return tabulate(rows, headers=["recorded in results.json", "A", "B"], tablefmt="github") + f"\n\n{python}."


def profile_mismatch(rounds: Rounds) -> str | None:
    """None when every round of both sides ran on one profile; else which rounds differ, and in what."""
    rounds_seen = [(s, i, r) for s in SIDES for i, r in enumerate(rounds.records[s], 1)]
    if not rounds_seen:
        return None
    side0, i0, first = rounds_seen[0]
    for side, i, record in rounds_seen[1:]:
        if record.profile_id != first.profile_id:
            keys = sorted(set(first.profile) | set(record.profile))
            diff = ", ".join(f"{k} {first.profile.get(k)!r} vs {record.profile.get(k)!r}" for k in keys
                             if first.profile.get(k) != record.profile.get(k))
            return (f"{side0.upper()}'s round {i0} ran on profile {first.profile_id}, {side.upper()}'s round {i} on "
                    f"{record.profile_id} ({diff or 'the profile ids differ'}): measurements of two profiles are not "
                    "an A/B comparison (run both sides on one machine and settings)")
    return None


def _flat(value, prefix: str = "") -> dict[str, object]:
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, object] = {}
    for key, inner in value.items():
        out.update(_flat(inner, f"{prefix}.{key}" if prefix else str(key)))
    return out


def setting_differences(rounds: Rounds, limit: int = 4) -> list[str]:
    """Per scenario both sides ran, the settings their results recorded differently (``seq_len 512 vs 256``): the
    two sides read one suite file with their own code, so a change there (a default, a parser) changes what B
    measured; the reader has to know before trusting the verdict."""
    def configs(side: str) -> dict[str, dict]:
        return {r.id: _flat(r.config.to_plain()) for record in rounds.records[side] for r in record.results}

    a, b = configs("a"), configs("b")
    out = []
    for scenario in sorted(set(a) & set(b)):
        keys = sorted(k for k in set(a[scenario]) | set(b[scenario]) if a[scenario].get(k) != b[scenario].get(k))
        if keys:
            shown = ", ".join(f"{k} {a[scenario].get(k)!r} vs {b[scenario].get(k)!r}" for k in keys[:limit])
            more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
            out.append(f"`{scenario}` ran with other settings in B than in A: {shown}{more}")
    return out
