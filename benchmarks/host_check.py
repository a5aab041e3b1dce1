"""Judge suite runs made on one host against a baseline made elsewhere, with the real gate, without rerunning
anything: ``python benchmarks/host_check.py --baseline FILE RESULTS.json ...`` (seconds; no torch).

What it answers: would this run (a results.json from ``pytest --flashckpt-suite`` or ``flashckpt run`` on another
machine of the profile, or under a stand-in for one) pass against that baseline, and which gated metrics are
``ok``, ``regressed``, ``~``, ``unstable``? Writes ``reports/host-check.md`` (``--out``) with the command, each run's
recorded load (when its folder has a ``load.txt``) and the verdict counts per metric.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

from pytest_flashckpt.baselines.regression_verdicts import Thresholds, compare_scenario
from pytest_flashckpt.baselines.store import Baseline
from pytest_flashckpt.config.record_file import read_record

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("regressed", "improved", "~", "unstable", "unguarded", "ok")


def shown(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--baseline", type=Path, required=True, action="append", help="repeat to judge against several")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "host-check.md")
    args = parser.parse_args()
    cmd = "python benchmarks/host_check.py " + " ".join(f"--baseline {shown(b)}" for b in args.baseline) + " " + " ".join(
        shown(r) for r in args.results)
    lines = ["# Runs of one host judged against a baseline made elsewhere", "", f"Command: `{cmd}`", ""]
    for baseline_path in args.baseline:
        baseline = Baseline.read(baseline_path)
        for path in args.results:
            record = read_record(path)
            load = path.parent / "load.txt"
            counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
            regressed = []
            for result in record.results:
                stored = baseline.scenarios.get(result.id)
                if result.status != "measured" or stored is None:
                    continue
                rows, _ = compare_scenario(result.id, stored, result.metrics, result.samples, result.probe, Thresholds())
                for row in rows:
                    counts[row.metric][row.verdict] += 1
                    if row.verdict in ("regressed", "missing"):
                        regressed.append(f"`{row.scenario}` {row.metric} {row.change:+.1%}" if row.change is not None else
                                         f"`{row.scenario}` {row.metric}")
            runs = sorted({len(e.runs or [None]) for e in baseline.scenarios.values()})
            lines += [
                f"## `{shown(path)}` against `{shown(baseline_path)}` ({'/'.join(map(str, runs))} run(s) per entry)",
                "",
                f"Run created {record.created}, commit {(record.commit or '?')[:12]}"
                + (f"; load: {load.read_text().strip()}" if load.is_file() else "") + ".  ",
                f"**{'FAILS' if regressed else 'passes'}**: {len(regressed)} regressed or missing"
                + (f" ({'; '.join(regressed)})" if regressed else "") + ".",
                "",
                "| metric | " + " | ".join(WORDS) + " |",
                "| --- |" + " --- |" * len(WORDS),
            ]
            for metric in sorted(counts):
                lines.append(f"| `{metric}` | " + " | ".join(str(counts[metric][w]) for w in WORDS) + " |")
            lines.append("")
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
