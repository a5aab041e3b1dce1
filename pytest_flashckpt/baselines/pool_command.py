"""``flashckpt pool-baseline``: add suite runs (results files, or baseline files' runs) to their profile's
baseline in ``--out`` (``pooled.save_pooled``), refusing runs that must not be pooled (``pool_inputs``), and say
what changed. ``cli`` registers it (``add_parser``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pytest_flashckpt.baselines.pool_inputs import read_runs
from pytest_flashckpt.baselines.pooled import save_pooled
from pytest_flashckpt.baselines.store import BaselineError
from pytest_flashckpt.config.errors import ConfigError, InputError
from pytest_flashckpt.config.preflight import check_output_folder
from pytest_flashckpt.core.files import shown_path


def run(args: argparse.Namespace) -> int:
    try:
        out = Path(args.out)
        check_output_folder("--out", out)
        if args.replace and args.restart:
            raise BaselineError("--replace starts the whole baseline afresh and --restart only the scenarios it names; "
                                "give one of them")
        inputs = read_runs(args.results, args.label, out)
        if not inputs.runs:
            raise BaselineError("no runs to pool: every file given is the baseline being added to; name a results.json")
        saved = save_pooled(out, inputs.runs, replace=args.replace, restart=args.restart or ())
    except (BaselineError, ConfigError) as exc:
        raise InputError(str(exc)) from None
    for line in inputs.skipped:
        print(f"skipped {line}")
    kept = f"; the previous file is {shown_path(saved.backup)}" if saved.backup else ""
    print(f"{shown_path(saved.path)}: {saved.changes.describe()}{kept}")
    return 0


def add_parser(sub) -> None:
    pool = sub.add_parser("pool-baseline", help="add suite runs (hosts) of a profile to its baseline",
                          description="Add several results.json of one profile (runs on several hosts, or one host's "
                                      "several runs) to baselines/<profile>.json: every run's samples are kept apart, "
                                      "so the gate judges a change against the spread between runs and calls a metric "
                                      "whose runs spread too far 'unstable' (baselines/README.md). Scenarios the runs "
                                      "did not measure stay as they were; the previous file is kept as "
                                      "<profile>.json.bak. Interrupted runs, runs with errored scenarios or an "
                                      "injected regression, and runs already pooled are refused.")
    pool.add_argument("results", nargs="+", metavar="RESULTS.json", help="results files of suite runs, one per run")
    pool.add_argument("--label", action="append", metavar="NAME",
                      help="a name per results file, in order (default: each file's folder name)")
    pool.add_argument("--out", default="baselines", metavar="DIR", help="baseline folder (default: baselines)")
    pool.add_argument("--replace", action="store_true",
                      help="start the profile's baseline afresh from these runs (the old file is kept as .bak)")
    pool.add_argument("--restart", action="append", metavar="SCENARIO",
                      help="take only this scenario (suite::name, repeatable) from the runs and start its entry afresh "
                           "from them, dropping the runs the file held for it: a scenario whose configuration changed "
                           "(its old runs cannot be pooled with new ones); every other entry stays as it was")
    pool.set_defaults(run=run)
