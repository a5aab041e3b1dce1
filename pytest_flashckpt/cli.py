"""The ``flashckpt`` command: run a suite without pytest, re-render a report from a results file, compare two runs
for a pull request, pool baselines, A/B two code versions, find change points over CI runs, simulate a step, and
look at or export checkpoints.

    flashckpt run --suite NAME|PATH [--report DIR] [--device cuda] [--save-baseline] ...
    flashckpt report flashckpt-report/results.json [--out DIR]
    flashckpt compare main.json branch.json [--metric overhead ...] [--out FILE]
    flashckpt claims
    flashckpt inspect CKPT
    flashckpt export CKPT OUT.safetensors
    flashckpt simulate --model gpt3-2.7b --seq 2048 --batch 8 --dtype bf16 --strategy full --device-memory 80GiB
    flashckpt fit --model llama3-70b --seq 8192 --global-batch-tokens 1048576 --gpus 8,16,64 --device-memory 80GiB
    flashckpt pool-baseline RUN1/results.json RUN2/results.json [--out baselines] [--replace]
    flashckpt ab --a main --b HEAD|--b-path . [--suite ab] [--suite-from a|here] [--rounds 6]
    flashckpt history DIR [--metric NAME ...]

``run`` measures a suite without pytest (``runner.suite.SuiteRun.run_all``: the scenario runners, the baseline gate
and the end summary the plugin uses) and writes the same ``results.json`` and report as ``pytest --flashckpt-suite``;
its options are the plugin's (``config.run_options``) without the ``flashckpt-`` prefix. ``report``, ``compare``,
``claims`` and ``pool-baseline`` read only ``results.json`` files (never torch), so they run on any machine that has
the files; ``inspect`` and ``export`` read checkpoints and ``simulate`` runs a step on the meta device (they import
torch). Problems with an input file or option (missing, not JSON, another schema version, not a checkpoint, a bad
value) are usage errors: a message naming the file on stderr and exit status 2, like argparse's own errors.
``inspect`` exits 1 when the checkpoint fails verification; ``run`` exits 1 on a regression or a broken scenario
and 2 when interrupted (Ctrl-C / SIGTERM).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from pytest_flashckpt.ab.command import add_parser as add_ab_parser
from pytest_flashckpt.baselines.pool_command import add_parser as add_pool_baseline_parser
from pytest_flashckpt.config.errors import ConfigError, InputError  # InputError: shared with the simulate command
from pytest_flashckpt.config.preflight import check_output_folder
from pytest_flashckpt.config.run_options import OPTIONS, OptionError, Options
from pytest_flashckpt.core.claims import CLAIMS
from pytest_flashckpt.core.files import atomic_write_text
from pytest_flashckpt.runner.threads import prefer_passive_openmp
from pytest_flashckpt.core.result import SCHEMA_VERSION, RunRecord
from pytest_flashckpt.fit.command import add_parser as add_fit_parser
from pytest_flashckpt.config.record_file import read_record
from pytest_flashckpt.history.command import add_parser as add_history_parser
from pytest_flashckpt.report import write_report
from pytest_flashckpt.report.compare import DEFAULT_METRICS, compare_markdown
from pytest_flashckpt.report.terminal import Heartbeat, scenario_line
from pytest_flashckpt.runner.preflight import check_run, command_flag
from pytest_flashckpt.runner.summary import end_summary
from pytest_flashckpt.simulate.cli import add_parser as add_simulate_parser

# Imported inside the commands that need them, deliberately: runner.suite (``run``) and checkpoint (``inspect``,
# ``export``) import torch, which ``report``, ``compare``, ``claims`` and ``pool-baseline`` never need.

USAGE_ERROR = 2

EPILOG = f"""\
A suite run (pytest --flashckpt-suite=NAME, or flashckpt run) writes flashckpt-report/results.json (schema version
{SCHEMA_VERSION}) and flashckpt-report/flashckpt-report.md. Exit status: 0 on success, 1 when `run` found a regression
or a scenario broke or `inspect` found a corrupt checkpoint, 2 on a usage error or an unreadable input file."""

FAILED = 1
INTERRUPTED = 2  # as pytest's ExitCode.INTERRUPTED: a run stopped by Ctrl-C / SIGTERM


def _read(path: str) -> RunRecord:
    try:
        return read_record(Path(path))
    except ValueError as exc:  # read_json's messages already name the file
        raise InputError(str(exc)) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read results file ({exc})") from None


def _option_flag(name: str) -> str:
    return "--" + name.removeprefix("flashckpt-")


def _cmd_run(args: argparse.Namespace) -> int:
    prefer_passive_openmp()  # before torch is imported (runner/threads.py)
    from pytest_flashckpt.runner.cards import CardShelf
    from pytest_flashckpt.runner.suite import SuiteRun, load_checked_suite  # imports torch

    def lookup(spec):
        return getattr(args, spec.dest), _option_flag(spec.name)

    try:
        options = Options.from_lookup(args.suite, lookup)
    except OptionError as exc:
        raise InputError(str(exc)) from None
    cards = CardShelf()  # each model card read once: the preflight and the run
    try:
        suite = load_checked_suite(args.suite, cards)
    except ConfigError as exc:  # a problem with no file is the option's: an unknown suite name
        raise InputError(str(exc if exc.where else exc.within("--suite"))) from None
    heartbeat = Heartbeat()

    def progress(scenario, phase: str) -> None:  # a long scenario says which phase it is in every few seconds
        if heartbeat.due():
            print(f"  ... {scenario.suite}::{scenario.name}: {phase}", flush=True)

    def done(outcome) -> None:  # one line per scenario as it finishes, and why it fails when it does
        print(scenario_line(outcome.result, outcome.verdict), flush=True)
        failure = f"baseline: {outcome.baseline_error}" if outcome.baseline_error else outcome.failure
        if failure:
            print("  " + failure.replace("\n", "\n  "), flush=True)

    run = SuiteRun(suite, options, progress=progress, cards=cards)
    try:
        check_run(run, command_flag)  # outputs, device, probe, baseline file, memory, disk: before anything runs
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    outputs = run.run_all(on_start=lambda scenario: heartbeat.printed(), on_outcome=done)  # Ctrl-C / SIGTERM: exit 2
    for line in end_summary(run, outputs, flag=command_flag):
        print(line)
    if run.interrupted:
        return INTERRUPTED
    return FAILED if run.failed() else 0


def _cmd_report(args: argparse.Namespace) -> int:
    record = _read(args.results)
    out = Path(args.out) if args.out else Path(args.results).resolve().parent
    try:
        check_output_folder("--out", out)
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    path = write_report(record, out, base=Path(args.results).resolve().parent)
    print(path)
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else None
    if out is not None and (out.is_dir() or not out.parent.is_dir()):  # before reading: a usage error, not a traceback
        raise InputError(f"--out {out}: {'is a folder' if out.is_dir() else 'its folder does not exist'}; "
                         "name the markdown file to write (e.g. --out compare.md)")
    a, b = _read(args.a), _read(args.b)
    text = compare_markdown(a, b, args.a, args.b, tuple(args.metric) if args.metric else DEFAULT_METRICS)
    if out is not None:
        atomic_write_text(out, text)  # never a half-written comment file
    else:
        sys.stdout.write(text)
    return 0


def _cmd_claims(args: argparse.Namespace) -> int:
    for claim in CLAIMS.values():
        print(f"{claim.id}: {claim.title} -- {claim.strategy}")
        print(f"    claimed: saving {claim.describe_saving()} (holds within ±{claim.saving_tolerance * 100:.0f} pp), "
              f"overhead {claim.describe_overhead()}")
        if claim.save is not None:
            print(f"    save: {claim.save.text}")
        print(f"    article: {claim.quote}")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from pytest_flashckpt.checkpoint.errors import CheckpointError  # imports torch
    from pytest_flashckpt.checkpoint.inspection import inspect_checkpoint

    try:
        found = inspect_checkpoint(Path(args.path))
    except CheckpointError as exc:
        raise InputError(str(exc)) from None
    print("\n".join(found.lines))
    return 0 if found.verified else 1


def _cmd_export(args: argparse.Namespace) -> int:
    from pytest_flashckpt.checkpoint.errors import CheckpointError  # imports torch
    from pytest_flashckpt.checkpoint.export import export_weights

    try:
        done = export_weights(Path(args.checkpoint), Path(args.out))
    except CheckpointError as exc:
        raise InputError(str(exc)) from None
    tied = f"; tied aliases written beside their owners: {', '.join(done.tied)}" if done.tied else ""
    print(f"{done.path}: {len(done.keys)} tensors from {done.source} (step {done.metadata['flashckpt.step']}){tied}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flashckpt",
        description="Reports from pytest-flashckpt suite runs: the article's claims beside measured memory, time and checkpoint I/O.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run_parser(sub)
    _add_results_parsers(sub)
    _add_checkpoint_parsers(sub)
    add_simulate_parser(sub)
    add_fit_parser(sub)
    add_pool_baseline_parser(sub)
    add_ab_parser(sub)
    add_history_parser(sub)
    return parser


def _add_run_parser(sub) -> None:
    """``run``: the plugin's options (``config.run_options.OPTIONS``) without their ``flashckpt-`` prefix."""
    run = sub.add_parser("run", help="run a scenario suite without pytest; writes results.json and the report",
                         description="Measure a suite (shipped name or YAML path) as pytest --flashckpt-suite does, "
                                     "judge it against the baseline and write results.json and the markdown report.")
    run.add_argument("--suite", default="default", metavar="NAME|PATH", help="suite to run (default: default)")
    for spec in OPTIONS:
        flag = _option_flag(spec.name)
        if isinstance(spec.default, bool):
            run.add_argument(flag, dest=spec.dest, action="store_true", default=None, help=spec.help)
        else:
            run.add_argument(flag, dest=spec.dest, default=None, metavar=flag[2:].split("-")[-1].upper(),
                             help=f"{spec.help} (default: {spec.default})")
    run.set_defaults(run=_cmd_run)


def _add_results_parsers(sub) -> None:
    """The commands that read only results files (never torch): ``report``, ``compare``, ``claims``."""
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


def _add_checkpoint_parsers(sub) -> None:
    """The commands that read a checkpoint: ``inspect`` and ``export``."""
    inspect = sub.add_parser("inspect", help="a checkpoint's step, strategy, files and sizes, and its manifest check",
                             description="Print a checkpoint's step, the strategy that wrote it, its files and sizes, and "
                                         "whether they match its manifest (exit 1 when not). CKPT is a checkpoint folder "
                                         "or a checkpoint root (the one `latest` names is inspected).")
    inspect.add_argument("path", metavar="CKPT", help="a checkpoint folder or a checkpoint root")
    inspect.set_defaults(run=_cmd_inspect)

    export = sub.add_parser("export", help="the model's weights as a plain state dict (.safetensors or .pt)",
                            description="Verify a checkpoint and write its model weights under the model's own keys, "
                                        "each tensor once (a tied alias is dropped, as transformers does), with "
                                        "format=pt and flashckpt.* metadata in a .safetensors file.")
    export.add_argument("checkpoint", metavar="CKPT", help="a checkpoint folder or a checkpoint root (its latest)")
    export.add_argument("out", metavar="OUT", help="the file to write: *.safetensors or *.pt")
    export.set_defaults(run=_cmd_export)


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
