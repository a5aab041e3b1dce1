"""The ``flashckpt`` command: re-render a report from a results file, or compare two runs for a pull request.

    flashckpt report reports/results.json [--out DIR]
    flashckpt compare main.json branch.json [--metric overhead ...] [--out FILE]
    flashckpt claims

It reads only ``results.json`` files (never torch), so it runs on any machine that has the files. Problems with
an input file (missing, not JSON, another schema version) are usage errors: a message naming the file on stderr
and exit status 2, like argparse's own errors.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from pytest_flashckpt.result import SCHEMA_VERSION, RunRecord

USAGE_ERROR = 2

EPILOG = f"""\
A suite run (pytest --flashckpt-suite=NAME) writes reports/results.json (schema version {SCHEMA_VERSION}) and
reports/flashckpt-report.md. Exit status: 0 on success, 2 on a usage error or an unreadable results file."""


class InputError(Exception):
    """A results file could not be used; the message names it."""


def _read(path: str) -> RunRecord:
    try:
        return RunRecord.read_json(Path(path))
    except ValueError as exc:  # read_json's messages already name the file
        raise InputError(str(exc)) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read results file ({exc})") from None


def _cmd_report(args: argparse.Namespace) -> int:
    from pytest_flashckpt.report import write_report

    record = _read(args.results)
    out = Path(args.out) if args.out else Path(args.results).resolve().parent
    path = write_report(record, out)
    print(path)
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from pytest_flashckpt.report.compare import DEFAULT_METRICS, compare_markdown

    a, b = _read(args.a), _read(args.b)
    text = compare_markdown(a, b, args.a, args.b, tuple(args.metric) if args.metric else DEFAULT_METRICS)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def _cmd_claims(args: argparse.Namespace) -> int:
    from pytest_flashckpt.claims import CLAIMS

    for claim in CLAIMS.values():
        print(f"{claim.id}: {claim.title} -- {claim.strategy}")
        print(f"    claimed: saving {claim.describe_saving()} (holds within ±{claim.saving_tolerance * 100:.0f} pp), "
              f"overhead {claim.describe_overhead()}")
        if claim.save is not None:
            print(f"    save: {claim.save.text}")
        print(f"    article: {claim.quote}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from pytest_flashckpt.report.compare import DEFAULT_METRICS

    parser = argparse.ArgumentParser(
        prog="flashckpt",
        description="Reports from pytest-flashckpt suite runs: the article's claims beside measured memory, time and checkpoint I/O.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    report = sub.add_parser("report", help="re-render the markdown report (and plots) from a results file",
                            description="Re-render flashckpt-report.md and its PNG plots from a results.json.")
    report.add_argument("results", metavar="RESULTS.json", help="a results file written by a suite run")
    report.add_argument("--out", metavar="DIR", help="folder for the report and plots (default: the results file's folder)")
    report.set_defaults(run=_cmd_report)

    compare = sub.add_parser("compare", help="markdown comparison of two runs (for pull-request comments)",
                             description="Print, per scenario measured in both runs, each metric in A and B and the change "
                                         "of B against A (relative %, or percentage points for fractions).")
    compare.add_argument("a", metavar="A.json", help="the base run (e.g. main)")
    compare.add_argument("b", metavar="B.json", help="the run to judge (e.g. the pull request)")
    compare.add_argument("--metric", action="append", metavar="NAME",
                         help=f"metric to compare; repeat for several (default: {', '.join(DEFAULT_METRICS)})")
    compare.add_argument("--out", metavar="FILE", help="write the markdown here instead of standard output")
    compare.set_defaults(run=_cmd_compare)

    claims = sub.add_parser("claims", help="list the article's claims and how each is judged")
    claims.set_defaults(run=_cmd_claims)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except InputError as exc:
        print(f"flashckpt {args.command}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
