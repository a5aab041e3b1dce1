"""Are two runs' exact metrics equal to the byte? ``python benchmarks/exact_metrics_equal.py A/results.json B/results.json``

Compares every scenario both records measured, on every metric of kind ``exact`` or ``memory`` (exact under the
cpu probe: peak, state, activation, FLOP counts, bytes written) and the labels; timing ratios and absolute times
are left out (they are noisy by nature), and so is ``roofline_shape`` (the GEMM shape where a timed roofline
peaked: a timing outcome). An exact metric with a ``slack`` in its row (``bytes_written``: a save's file holds a
few bytes that vary from run to run) is equal within it, as the gate judges it; every other value to the byte. Prints each difference and exits 1 when there is one; scenarios only one
side has are listed, not failed (a subset run against the whole sample). Used for issue 31's speed-ups: the default
suite's exact metrics stay byte-equal to ``reports/sample/results.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pytest_flashckpt.core.metrics import LABELS, NUMBERS

EXACT_KINDS = ("exact", "memory")
TIMING_LABELS = ("roofline_shape",)


def exact_metrics(path: Path) -> dict[str, dict[str, object]]:
    record = json.loads(path.read_text())
    out = {}
    for result in record["results"]:
        if result["status"] != "measured":
            continue
        metrics = result["metrics"]
        out[f"{result['suite']}::{result['scenario']}"] = {
            name: json.dumps(value) for name, value in sorted(metrics.items())
            if (name in NUMBERS and NUMBERS[name].kind in EXACT_KINDS) or (name in LABELS and name not in TIMING_LABELS)
        }
    return out


def _within_slack(name: str, left: str, right: str) -> bool:
    slack = NUMBERS[name].slack if name in NUMBERS else 0.0
    if not slack or "(absent)" in (left, right):
        return False
    a, b = json.loads(left), json.loads(right)
    return abs(a - b) <= slack * max(abs(a), abs(b))


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.splitlines()[0])
        return 2
    a, b = (exact_metrics(Path(p)) for p in sys.argv[1:])
    differences, compared = 0, 0
    for scenario in sorted(a.keys() & b.keys()):
        for name in sorted(a[scenario].keys() | b[scenario].keys()):
            compared += 1
            left, right = a[scenario].get(name, "(absent)"), b[scenario].get(name, "(absent)")
            if left != right and not _within_slack(name, left, right):
                differences += 1
                print(f"{scenario}: {name}: {left} != {right}")
    only = sorted(a.keys() ^ b.keys())
    print(f"{len(a.keys() & b.keys())} scenarios in both, {compared} exact values compared, {differences} differ"
          + (f"; in one side only: {', '.join(only)}" if only else ""))
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
