"""Compare the exact metrics of two suite runs, scenario by scenario: ``python tools/exact_diff.py OLD NEW``.

"Exact" is every integer-valued metric (bytes, FLOPs, files, counts) of the scenarios both ``results.json`` files
hold; floats (times, ratios) are left out. Prints each difference and a summary; exit status 1 when any exact
value differs (so it can gate "the default suite's exact metrics unchanged to the byte"). Reads both files through
``config.record_file.read_record`` (schema upgrades included).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_flashckpt.config.record_file import read_record


def exact_values(path: Path) -> dict[str, dict[str, int]]:
    record = read_record(path)
    return {f"{r.suite}::{r.scenario}": {k: v for k, v in r.metrics.items() if isinstance(v, int) and not isinstance(v, bool)}
            for r in record.results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--ignore", action="append", default=[], help="metric name to leave out (repeatable)")
    args = parser.parse_args(argv)
    old, new = exact_values(args.old), exact_values(args.new)
    shared = sorted(set(old) & set(new))
    compared = differ = 0
    for name in shared:
        for metric in sorted(set(old[name]) | set(new[name])):
            if metric in args.ignore:
                continue
            a, b = old[name].get(metric), new[name].get(metric)
            compared += 1
            if a != b:
                differ += 1
                print(f"{name}: {metric}: {a} -> {b}")
    only_old, only_new = sorted(set(old) - set(new)), sorted(set(new) - set(old))
    print(f"{len(shared)} scenarios in both, {compared} exact values compared, {differ} differ; "
          f"only in {args.old}: {only_old or 'none'}; only in {args.new}: {only_new or 'none'}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
