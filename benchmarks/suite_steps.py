"""Training steps a suite run takes, per scenario, with and without shared timing passes; writes reports/suite-steps.md.

    python benchmarks/suite_steps.py                      # the default suite (README's first command's scenarios)
    python benchmarks/suite_steps.py --suite activation

Wall time on a shared 2-core machine moves by a third between days (reports/test-run-time.md); the number of
training steps a run takes does not. This runs the suite twice in one process, both with the pytest plugin as
README's first command does, counting ``Trainer.train_step`` calls and the FLOP counter's forward + backward per
scenario: once as shipped (the scenarios of one reference share one timing pass, ``runner/timing_group.py``) and
once with the plan withheld (each scenario timed beside its own reference's steps: the runner before the groups).
The report gives both counts and each run's wall seconds, measured side by side on the same machine.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from report_output import write_or_print  # noqa: E402


class StepCounter:
    """A pytest plugin: ``Trainer.train_step`` and ``count_step`` calls per scenario item, and each item's seconds."""

    def __init__(self) -> None:
        self.steps: collections.Counter[str] = collections.Counter()
        self.counted: collections.Counter[str] = collections.Counter()
        self.seconds: dict[str, float] = {}
        self.current = "(outside a scenario)"

    def install(self, monkeypatch) -> None:
        from pytest_flashckpt import training
        from pytest_flashckpt.activation import flops

        counter = self
        train_step, count_step = training.Trainer.train_step, flops.count_step

        def counted_train_step(trainer, *args, **kwargs):
            counter.steps[counter.current] += 1
            return train_step(trainer, *args, **kwargs)

        def counted_count_step(trainer):
            counter.counted[counter.current] += 1
            return count_step(trainer)

        monkeypatch.setattr(training.Trainer, "train_step", counted_train_step)
        monkeypatch.setattr(flops, "count_step", counted_count_step)

    def pytest_runtest_call(self, item) -> None:
        self.current = item.nodeid.split("::", 1)[-1] if "::" in item.nodeid else item.nodeid

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call":
            self.seconds[self.current] = report.duration


def _run(suite: str, planned: bool) -> tuple[StepCounter, float, int]:
    import pytest

    from pytest_flashckpt.runner.suite import SuiteRun

    counter = StepCounter()
    patch = pytest.MonkeyPatch()
    counter.install(patch)
    if not planned:
        patch.setattr(SuiteRun, "plan", lambda self, scenarios: None)
    report = tempfile.mkdtemp(prefix="suite-steps-")
    begin = time.monotonic()
    try:
        code = pytest.main([f"--flashckpt-suite={suite}", f"--flashckpt-report={report}", "--flashckpt-no-compare",
                            "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                            "-W", "ignore::pytest.PytestAssertRewriteWarning"], plugins=[counter])
    finally:
        patch.undo()
    return counter, time.monotonic() - begin, int(code)


def _table(shipped: StepCounter, alone: StepCounter) -> list[str]:
    names = list(dict.fromkeys([*alone.seconds, *shipped.seconds]))
    rows = ["| scenario | train steps (shared timing) | train steps (each timed alone) | FLOP-count steps | seconds (shared / alone) |",
            "| --- | ---: | ---: | ---: | ---: |"]
    for name in names:
        rows.append(f"| `{name}` | {shipped.steps[name]} | {alone.steps[name]} | {shipped.counted[name]} | "
                    f"{shipped.seconds.get(name, 0):.1f} / {alone.seconds.get(name, 0):.1f} |")
    total_s, total_a = sum(shipped.steps.values()), sum(alone.steps.values())
    rows.append(f"| **all** | **{total_s}** | **{total_a}** | {sum(shipped.counted.values())} | "
                f"{sum(shipped.seconds.values()):.1f} / {sum(alone.seconds.values()):.1f} |")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="default")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "suite-steps.md")
    parser.add_argument("--print", dest="print_only", action="store_true", help="print the report instead of writing it")
    args = parser.parse_args()
    os.chdir(ROOT)
    load_before = os.getloadavg()[0]
    shipped, shipped_s, code_s = _run(args.suite, planned=True)
    alone, alone_s, code_a = _run(args.suite, planned=False)
    total_s, total_a = sum(shipped.steps.values()), sum(alone.steps.values())
    import torch

    lines = [
        f"# Training steps of the `{args.suite}` suite: shared timing passes vs each scenario timed alone", "",
        f"Command: `python benchmarks/suite_steps.py --suite {args.suite}` on "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC (torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; load average {load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after).", "",
        f"Both runs are README's first command's plugin path in one process, one after the other: shared timing "
        f"(as shipped, exit {code_s}) {shipped_s:.0f} s wall; each scenario timed beside its own reference (the "
        f"plan withheld, exit {code_a}) {alone_s:.0f} s wall. Training steps: **{total_s}** vs **{total_a}** "
        f"({(total_a - total_s) / total_a:.0%} fewer). A step count does not move with the machine; the seconds do "
        "(read them as this run's, on this machine).", "",
        *_table(shipped, alone), "",
        "*train steps*: `Trainer.train_step` calls during the scenario's item (warm-up, memory pass, timing rounds, "
        "saves, time lost); *FLOP-count steps*: forwards + backwards under the FLOP counter (`count_step`). A "
        "scenario that builds the other members of its timing group counts their warm-up steps too.",
    ]
    write_or_print("\n".join(lines) + "\n", args.out, print_only=args.print_only)
    return max(code_s, code_a)


if __name__ == "__main__":
    sys.exit(main())
