"""``flashckpt history DIR``: read a folder of runs (``series``), find change points within each profile segment
(``changes``), write history.md and plots (``render``); what was skipped or dropped is said on stderr too. ``cli``
registers it (``add_parser``)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from pytest_flashckpt.config.errors import ConfigError, InputError
from pytest_flashckpt.config.preflight import check_output_folder


def run(args: argparse.Namespace) -> int:
    from pytest_flashckpt.history.changes import OtavaMissing, change_points_within, require
    from pytest_flashckpt.history.render import write
    from pytest_flashckpt.history.series import DEFAULT_METRICS, HistoryError, build_series, read_runs

    try:
        require()  # before reading anything: without Otava there is nothing to compute
        out = Path(args.out) if args.out else Path(args.folder)
        check_output_folder("--out", out)
        history = read_runs(Path(args.folder))
    except (OtavaMissing, HistoryError, ConfigError) as exc:
        raise InputError(str(exc)) from None
    series = build_series(history, tuple(args.metric) if args.metric else DEFAULT_METRICS)
    for line in history.skipped + history.dropped:
        print(f"flashckpt history: {line}", file=sys.stderr)
    found = [(s, change_points_within(s.values, s.segments(), args.max_pvalue, args.min_magnitude)) for s in series]
    command = "flashckpt " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["history"] else "flashckpt history ..."
    path = write(found, history, args.folder, command, out, args.max_pvalue, args.min_magnitude, draw=not args.no_plots)
    sys.stdout.write(path.read_text(encoding="utf-8"))
    print(f"wrote {path}")
    return 0


def add_parser(sub) -> None:
    from pytest_flashckpt.history.changes import INSTALL
    from pytest_flashckpt.history.series import DEFAULT_METRICS

    history = sub.add_parser("history", help="change points over a folder of suite runs (CI artifacts), with plots",
                             description="Read every results.json under DIR, order the runs by their recorded time, and "
                                         "find change points per scenario and metric with Apache Otava's e-divisive "
                                         f"method (optional; install: {INSTALL}), within each stretch of runs of one "
                                         "profile (a machine or software change is shown as such, never as a change "
                                         "point). Files that are not results files, and values that are not finite "
                                         "numbers, are skipped and listed. Writes history.md and trend plots (PNG, "
                                         "change points marked).")
    history.add_argument("folder", metavar="DIR", help="folder of runs (results.json at any depth)")
    history.add_argument("--metric", action="append", metavar="NAME",
                         help=f"metric to follow; repeat for several (default: {', '.join(DEFAULT_METRICS)})")
    history.add_argument("--max-pvalue", type=float, default=0.001, help="significance of a change point (default 0.001)")
    history.add_argument("--min-magnitude", type=float, default=0.02,
                         help="drop changes smaller than this fraction (default 0.02: run-to-run noise of a run's "
                              "median is 1-2%% here, reports/history-power.md)")
    history.add_argument("--out", metavar="DIR", help="folder for history.md and the plots (default: DIR)")
    history.add_argument("--no-plots", action="store_true", help="markdown only")
    history.set_defaults(run=run)
