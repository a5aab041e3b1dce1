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
    flashckpt pool-baseline RUN1/results.json RUN2/results.json [--out baselines]
    flashckpt ab --a main --b HEAD [--suite ab] [--rounds 6]
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

from pytest_flashckpt.config.errors import InputError  # shared with the simulate command
from pytest_flashckpt.config.run_options import OPTIONS, OptionError, Options
from pytest_flashckpt.core.result import SCHEMA_VERSION, RunRecord

USAGE_ERROR = 2

EPILOG = f"""\
A suite run (pytest --flashckpt-suite=NAME, or flashckpt run) writes flashckpt-report/results.json (schema version
{SCHEMA_VERSION}) and flashckpt-report/flashckpt-report.md. Exit status: 0 on success, 1 when `run` found a regression
or a scenario broke or `inspect` found a corrupt checkpoint, 2 on a usage error or an unreadable input file."""

FAILED = 1
INTERRUPTED = 2  # as pytest's ExitCode.INTERRUPTED: a run stopped by Ctrl-C / SIGTERM




def _read(path: str) -> RunRecord:
    try:
        return RunRecord.read_json(Path(path))
    except ValueError as exc:  # read_json's messages already name the file
        raise InputError(str(exc)) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read results file ({exc})") from None


def _option_flag(name: str) -> str:
    return "--" + name.removeprefix("flashckpt-")


def _cmd_run(args: argparse.Namespace) -> int:
    from pytest_flashckpt.config.errors import ConfigError

    def lookup(spec):
        return getattr(args, spec.dest), _option_flag(spec.name)

    try:
        options = Options.from_lookup(args.suite, lookup)
    except OptionError as exc:
        raise InputError(str(exc)) from None
    from pytest_flashckpt.report.terminal import Heartbeat, scenario_line
    from pytest_flashckpt.runner.suite import SuiteRun, load_checked_suite

    try:
        suite = load_checked_suite(args.suite)
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

    run = SuiteRun(suite, options, progress=progress)
    from pytest_flashckpt.runner.preflight import check_run, command_flag

    try:
        check_run(run, command_flag)  # outputs, device, probe, baseline file, memory, disk: before anything runs
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    from pytest_flashckpt.runner.summary import end_summary

    outputs = run.run_all(on_start=lambda scenario: heartbeat.printed(), on_outcome=done)  # Ctrl-C / SIGTERM: exit 2
    for line in end_summary(run, outputs, flag=command_flag):
        print(line)
    if run.interrupted:
        return INTERRUPTED
    return FAILED if run.failed() else 0


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
    from pytest_flashckpt.core.claims import CLAIMS

    for claim in CLAIMS.values():
        print(f"{claim.id}: {claim.title} -- {claim.strategy}")
        print(f"    claimed: saving {claim.describe_saving()} (holds within ±{claim.saving_tolerance * 100:.0f} pp), "
              f"overhead {claim.describe_overhead()}")
        if claim.save is not None:
            print(f"    save: {claim.save.text}")
        print(f"    article: {claim.quote}")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from pytest_flashckpt.checkpoint.errors import CheckpointError
    from pytest_flashckpt.checkpoint.inspection import inspect_checkpoint

    try:
        found = inspect_checkpoint(Path(args.path))
    except CheckpointError as exc:
        raise InputError(str(exc)) from None
    print("\n".join(found.lines))
    return 0 if found.verified else 1


def _cmd_export(args: argparse.Namespace) -> int:
    from pytest_flashckpt.checkpoint.errors import CheckpointError
    from pytest_flashckpt.checkpoint.export import export_weights

    try:
        done = export_weights(Path(args.checkpoint), Path(args.out))
    except CheckpointError as exc:
        raise InputError(str(exc)) from None
    tied = f"; tied aliases written beside their owners: {', '.join(done.tied)}" if done.tied else ""
    print(f"{done.path}: {len(done.keys)} tensors from {done.source} (step {done.metadata['flashckpt.step']}){tied}")
    return 0


def _cmd_pool_baseline(args: argparse.Namespace) -> int:
    from pytest_flashckpt.baselines import BaselineError
    from pytest_flashckpt.baselines.pooled import pool, read_runs

    try:
        baseline = pool(read_runs(args.results, args.label))
    except BaselineError as exc:
        raise InputError(str(exc)) from None
    out = Path(args.out) / f"{baseline.profile_id}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    baseline.write(out)
    runs = {len(e.get("runs") or ()) for e in baseline.scenarios.values()}
    print(f"{out}: {len(baseline.scenarios)} scenarios pooled from {len(args.results)} runs "
          f"({'/'.join(map(str, sorted(runs)))} runs per scenario)")
    return 0


def add_pool_baseline_parser(sub) -> None:
    pool = sub.add_parser("pool-baseline", help="one baseline from several suite runs (hosts) of a profile",
                          description="Pool several results.json of one profile (runs on several hosts, or one host's "
                                      "several runs) into baselines/<profile>.json: every run's samples are kept apart, "
                                      "so the gate judges a change against the spread between runs and calls a metric "
                                      "whose runs spread too far 'unstable' (baselines/README.md). Replaces the file.")
    pool.add_argument("results", nargs="+", metavar="RESULTS.json", help="results files of suite runs, one per run")
    pool.add_argument("--label", action="append", metavar="NAME",
                      help="a name per results file, in order (default: each file's folder name)")
    pool.add_argument("--out", default="baselines", metavar="DIR", help="baseline folder (default: baselines)")
    pool.set_defaults(run=_cmd_pool_baseline)


def _cmd_ab(args: argparse.Namespace) -> int:
    import os
    import shlex
    import time

    from pytest_flashckpt.ab.rounds import RoundError, run_rounds
    from pytest_flashckpt.ab.trees import RefError, checked_out
    from pytest_flashckpt.ab.verdicts import gate, markdown
    from pytest_flashckpt.baselines.regression_verdicts import Thresholds
    from pytest_flashckpt.config.errors import ConfigError
    from pytest_flashckpt.config.injection import Injection
    from pytest_flashckpt.config.suites import load_suite

    if args.rounds < 2:
        raise InputError(f"--rounds {args.rounds}: an A/B run needs at least 2 rounds (5 vs 5 is the least that can reach p < 0.01)")
    try:
        suite = load_suite(args.suite)  # checked here, before any tree is made: both versions run this file
    except ConfigError as exc:
        raise InputError(str(exc if exc.where else exc.within("--suite"))) from None
    extra: dict[str, list[str]] = {}
    for version, spec in (("a", args.inject_a), ("b", args.inject_b)):
        if spec:
            try:
                Injection.parse(spec)
            except ValueError as exc:
                raise InputError(f"--inject-{version} {spec}: {exc}") from None
            extra[version] = ["--inject", spec]
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    began, load_before = time.time(), os.getloadavg()[0]
    try:
        with checked_out({"--a": args.a, "--b": args.b}, Path.cwd()) as trees:
            trees = {"a": trees["--a"], "b": trees["--b"]}
            rounds = run_rounds(trees, str(suite.path.resolve()), args.rounds, out, extra,
                                say=lambda text: print(text, flush=True))
    except RefError as exc:
        raise InputError(str(exc)) from None
    except RoundError as exc:
        print(f"flashckpt ab: {exc}", file=sys.stderr)
        return FAILED
    thresholds = Thresholds(args.timing_tolerance, Thresholds.memory_tolerance, args.alpha)
    outcome = gate(rounds, thresholds)
    command = "flashckpt " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["ab"] else "flashckpt ab ..."
    text = markdown(outcome, trees, suite.name, args.rounds, thresholds, command, (time.time() - began) / 60,
                    (load_before, os.getloadavg()[0]))
    (out / "ab.md").write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    print(f"wrote {out / 'ab.md'} (each round's results.json beside it)")
    return FAILED if outcome.failed else 0


def add_ab_parser(sub) -> None:
    ab = sub.add_parser("ab", help="A/B: two code versions interleaved on this machine, gated with no baseline",
                        description="Run the suite for two versions of the code (a git commit/branch, or a folder with "
                                    "pytest_flashckpt in it) interleaved round by round on this machine, one process "
                                    "per version per round, and gate B against A (Mann-Whitney on the per-round "
                                    "values). Writes a markdown verdict table for a pull request. Exit 1 on a "
                                    "regression, 2 on a bad REF or option.")
    ab.add_argument("--a", required=True, metavar="REF", help="the base version (e.g. main)")
    ab.add_argument("--b", required=True, metavar="REF", help="the version to judge (e.g. the pull request's head)")
    ab.add_argument("--suite", default="ab", metavar="NAME|PATH", help="suite both versions run (default: ab, ~1 min a round quiet)")
    ab.add_argument("--rounds", type=int, default=6, help="rounds per version (default 6: 6 vs 6 can reach p = 0.0011)")
    ab.add_argument("--out", default="flashckpt-ab", metavar="DIR", help="folder for ab.md and each round's results")
    ab.add_argument("--timing-tolerance", type=float, default=0.05, help="ratio change tolerated (default 0.05)")
    ab.add_argument("--alpha", type=float, default=0.01, help="significance level (default 0.01)")
    ab.add_argument("--inject-a", default="", metavar="SPEC", help=argparse.SUPPRESS)
    ab.add_argument("--inject-b", default="", metavar="SPEC",
                    help="inject a known regression into B's runs (e.g. step=0.10, stall=0.25) to check the gate can fail")
    ab.set_defaults(run=_cmd_ab)


def _cmd_history(args: argparse.Namespace) -> int:
    import shlex

    from pytest_flashckpt.history.changes import OtavaMissing, change_points, require
    from pytest_flashckpt.history.render import write
    from pytest_flashckpt.history.series import DEFAULT_METRICS, HistoryError, build_series, read_runs

    try:
        require()  # before reading anything: without Otava there is nothing to compute
        runs = read_runs(Path(args.folder))
    except (OtavaMissing, HistoryError) as exc:
        raise InputError(str(exc)) from None
    series = build_series(runs, tuple(args.metric) if args.metric else DEFAULT_METRICS)
    found = [(s, change_points(s.values, args.max_pvalue, args.min_magnitude)) for s in series]
    command = "flashckpt " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["history"] else "flashckpt history ..."
    out = Path(args.out) if args.out else Path(args.folder)
    path = write(found, len(runs), args.folder, command, out, args.max_pvalue, args.min_magnitude, draw=not args.no_plots)
    sys.stdout.write(path.read_text(encoding="utf-8"))
    print(f"wrote {path}")
    return 0


def add_history_parser(sub) -> None:
    from pytest_flashckpt.history.changes import INSTALL
    from pytest_flashckpt.history.series import DEFAULT_METRICS

    history = sub.add_parser("history", help="change points over a folder of suite runs (CI artifacts), with plots",
                             description="Read every results.json under DIR, order the runs by their recorded time, and "
                                         "find change points per scenario and metric with Apache Otava's e-divisive "
                                         f"method (optional; install: {INSTALL}). Writes history.md and trend plots "
                                         "(PNG, change points marked).")
    history.add_argument("folder", metavar="DIR", help="folder of runs (results.json at any depth)")
    history.add_argument("--metric", action="append", metavar="NAME",
                         help=f"metric to follow; repeat for several (default: {', '.join(DEFAULT_METRICS)})")
    history.add_argument("--max-pvalue", type=float, default=0.001, help="significance of a change point (default 0.001)")
    history.add_argument("--min-magnitude", type=float, default=0.02,
                         help="drop changes smaller than this fraction (default 0.02: run-to-run noise of a run's "
                              "median is 1-2%% here, reports/history-power.md)")
    history.add_argument("--out", metavar="DIR", help="folder for history.md and the plots (default: DIR)")
    history.add_argument("--no-plots", action="store_true", help="markdown only")
    history.set_defaults(run=_cmd_history)


def build_parser() -> argparse.ArgumentParser:
    from pytest_flashckpt.report.compare import DEFAULT_METRICS

    parser = argparse.ArgumentParser(
        prog="flashckpt",
        description="Reports from pytest-flashckpt suite runs: the article's claims beside measured memory, time and checkpoint I/O.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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

    from pytest_flashckpt.simulate.cli import add_parser as add_simulate_parser

    add_simulate_parser(sub)
    add_pool_baseline_parser(sub)
    add_ab_parser(sub)
    add_history_parser(sub)
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
