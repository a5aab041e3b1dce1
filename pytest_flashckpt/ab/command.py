"""``flashckpt ab``: its options and what the command does with them. Everything checkable is checked before any
round runs (sides, suite, injections, the output folder: a usage error, exit 2); then the interleaved rounds, the
profile check, the gate, and ``ab.md``. ``cli`` only registers it."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from pytest_flashckpt.config.errors import ConfigError, InputError
from pytest_flashckpt.config.preflight import check_output_folder

FAILED = 1  # a regression, a broken round, or no verdict (two profiles)
INTERRUPTED = 2  # as ``flashckpt run``: stopped by Ctrl-C
ROUND_FOLDER = "round-*"


def _check_out(out: Path) -> None:
    """``--out`` must become a fresh job folder: a folder that can be made or written (the shared check of every
    output folder option), and not an earlier job's folder (its round files would be overwritten, or read back as
    this job's when a round writes nothing)."""
    try:
        check_output_folder("--out", out)
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    if out.is_dir() and ((out / "ab.md").exists() or any(out.glob(ROUND_FOLDER))):
        raise InputError(f"--out {out}: holds an earlier A/B job (ab.md or round-* folders); name a new folder, or "
                         "remove that one")


def _sides(args: argparse.Namespace):
    from pytest_flashckpt.ab.trees import Side

    return {name: Side(f"--{name}", getattr(args, name)) if getattr(args, name) is not None
            else Side(f"--{name}-path", getattr(args, f"{name}_path")) for name in ("a", "b")}


def run(args: argparse.Namespace) -> int:
    from pytest_flashckpt.ab.gitstate import folder_state
    from pytest_flashckpt.ab.provenance import describe_tree, profile_mismatch, unmeasured_changes
    from pytest_flashckpt.ab.rounds import RoundError, run_rounds
    from pytest_flashckpt.ab.suite_source import from_here, from_side_a
    from pytest_flashckpt.ab.trees import RefError, checked_out
    from pytest_flashckpt.ab.verdicts import Job, gate, markdown
    from pytest_flashckpt.baselines.regression_verdicts import Thresholds
    from pytest_flashckpt.config.injection import Injection
    from pytest_flashckpt.core.files import atomic_write_text

    if args.rounds < 2:
        raise InputError(f"--rounds {args.rounds}: an A/B run needs at least 2 rounds (5 vs 5 is the least that can reach p < 0.01)")
    extra: dict[str, list[str]] = {}
    for version, spec in (("a", args.inject_a), ("b", args.inject_b)):
        if spec:
            try:
                Injection.parse(spec)
            except ValueError as exc:
                raise InputError(f"--inject-{version} {spec}: {exc}") from None
            extra[version] = ["--inject", spec]
    out = Path(args.out).expanduser().resolve()
    _check_out(out)
    began, load_before = time.time(), os.getloadavg()[0]
    try:
        with checked_out(_sides(args), Path.cwd(), excluding=(out,)) as trees:
            source = from_side_a(args.suite, trees["a"]) if args.suite_from == "a" else from_here(args.suite)
            unmeasured = unmeasured_changes(folder_state(Path.cwd(), (out,)), trees)
            out.mkdir(parents=True, exist_ok=True)
            for name, tree in trees.items():
                print(f"{name.upper()} = {tree.side.option} {tree.label}: {describe_tree(tree)}".replace("`", ""), flush=True)
            print(f"{source.describe()}".replace("`", ""), flush=True)
            if unmeasured:
                print(f"warning: {unmeasured}".replace("`", ""), flush=True)
            rounds = run_rounds(trees, str(source.suite.path.resolve()), args.rounds, out, extra,
                                say=lambda text: print(text, flush=True))
    except RefError as exc:
        raise InputError(str(exc)) from None
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    except RoundError as exc:
        print(f"flashckpt ab: {exc}", file=sys.stderr)
        return FAILED
    except KeyboardInterrupt:  # the temporary worktrees are already removed; finished rounds stay in --out
        print(f"flashckpt ab: interrupted; no verdict (finished rounds' results.json are in {out})", file=sys.stderr)
        return INTERRUPTED
    thresholds = Thresholds(args.timing_tolerance, Thresholds.memory_tolerance, args.alpha)
    command = "flashckpt " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["ab"] else "flashckpt ab ..."
    job = Job(trees, source, rounds, thresholds, command, (time.time() - began) / 60, (load_before, os.getloadavg()[0]),
              unmeasured)
    refused = profile_mismatch(rounds)
    outcome = None if refused else gate(rounds, thresholds)
    text = markdown(job, outcome, refused)
    atomic_write_text(out / "ab.md", text)
    sys.stdout.write(text)
    print(f"wrote {out / 'ab.md'} (each round's results.json beside it)")
    if refused:
        print(f"flashckpt ab: no verdict: {refused}", file=sys.stderr)
        return FAILED
    return FAILED if outcome.failed else 0


def add_parser(sub) -> None:
    ab = sub.add_parser(
        "ab", help="A/B: two code versions interleaved on this machine, gated with no baseline",
        description="Run the suite for two versions of the code interleaved round by round on this machine, one "
                    "process per version per round, and gate B against A (Mann-Whitney on the per-round values). "
                    "Each side is a git REF (--a/--b: a commit, branch or tag, always; a folder of that name is never "
                    "run) or a folder (--a-path/--b-path DIR, run as it is, uncommitted changes included: --b-path . "
                    "measures the working tree). The suite comes from A's tree unless --suite-from here. Writes ab.md "
                    "(the sides' SHAs, the suite's file and commit, both sides' profiles and versions, the verdict "
                    "table). Exit 1 on a regression, a broken round or two profiles; 2 on a bad side, suite or option.")
    for name, role in (("a", "the base version (e.g. the merge base's SHA, or main)"),
                       ("b", "the version to judge (e.g. the pull request's head SHA)")):
        side = ab.add_mutually_exclusive_group(required=True)
        side.add_argument(f"--{name}", metavar="REF", help=f"{role}: a git commit, branch or tag of the current folder's "
                                                            "repository, checked out clean (never a folder)")
        side.add_argument(f"--{name}-path", metavar="DIR", help=f"{role[:role.index(' (')]} as a folder holding "
                                                                "pytest_flashckpt/, run as it is")
    ab.add_argument("--suite", default="ab", metavar="NAME|PATH",
                    help="suite both versions run (default: ab, ~1 min a round quiet); a NAME or a path relative to A's root")
    ab.add_argument("--suite-from", choices=("a", "here"), default="a",
                    help="where --suite is read: a = side A's tree (default: the version under test cannot pick what "
                         "it is judged on), here = as this command resolves it (its install, or a path from here)")
    ab.add_argument("--rounds", type=int, default=6, help="rounds per version (default 6: 6 vs 6 can reach p = 0.0011)")
    ab.add_argument("--out", default="flashckpt-ab", metavar="DIR",
                    help="a new folder for ab.md and each round's results (default: flashckpt-ab)")
    ab.add_argument("--timing-tolerance", type=float, default=0.05, help="ratio change tolerated (default 0.05)")
    ab.add_argument("--alpha", type=float, default=0.01, help="significance level (default 0.01)")
    ab.add_argument("--inject-a", default="", metavar="SPEC", help=argparse.SUPPRESS)
    ab.add_argument("--inject-b", default="", metavar="SPEC",
                    help="inject a known regression into B's runs (e.g. step=0.10, stall=0.25) to check the gate can fail")
    ab.set_defaults(run=run)
