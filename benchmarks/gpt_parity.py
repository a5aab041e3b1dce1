"""GPT parity check for a refactor: the exact metrics of activation-suite scenarios against a stored results.json.

    PYTHONPATH=. python benchmarks/gpt_parity.py none-sdpa-s256 full-sdpa-s256 ... [--results reports/sample/results.json]

Runs each named scenario of the ``activation`` suite with the memory and FLOP passes only (no timing) and compares
``peak_bytes``, ``step_flops`` and ``state_bytes`` with the stored run's, byte for byte. Used when the GPT moved
into ``models/gpt/`` (issue 20): every number must be identical. Exit status 1 if any differs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from pytest_flashckpt.config.suites import load_suite
from pytest_flashckpt.runner.context import RunContext
from pytest_flashckpt.runner.run import run_scenario

EXACT = ("peak_bytes", "step_flops", "state_bytes")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="+")
    parser.add_argument("--results", default="reports/sample/results.json")
    args = parser.parse_args()
    stored = {r["scenario"]: r for r in json.load(open(args.results))["results"] if r["suite"] == "activation"}
    ctx = RunContext.resolve("cpu")
    different = 0
    for scenario in load_suite("activation").scenarios:
        if scenario.name not in args.scenarios:
            continue
        result = run_scenario(dataclasses.replace(scenario, measure=("memory", "flops")), ctx)
        for key in EXACT:
            now, then = result.metrics.get(key), stored[scenario.name]["metrics"].get(key)
            different += now != then
            print(f"{scenario.name} {key}: {now} vs {then} {'identical' if now == then else 'DIFFERENT'}", flush=True)
    print("all identical" if not different else f"{different} different")
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main())
