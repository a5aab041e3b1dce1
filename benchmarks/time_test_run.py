"""Wall and CPU time of README's two commands (docs/contributing.md "Tests"); writes reports/test-run-time.md.

    python benchmarks/time_test_run.py --runs 2 --one-process --suite
    python benchmarks/time_test_run.py --runs 1 --suite --load 1    # the slower host of issue 31
    python benchmarks/time_test_run.py --runs 1 --suite --load 1 --omp-wait-policy libgomp-default  # before issue 31

Runs plain ``pytest`` (README's test command: pytest-xdist workers, one per core, see tests/conftest.py) ``--runs``
times in this checkout; with ``--one-process`` also ``pytest -n 0`` once, and with ``--suite`` README's first
command, ``pytest --flashckpt-suite`` (the default suite on a CPU; its report goes to a temporary folder, so the
committed sample is never touched), once. Records each run's wall time, the CPU time of pytest and every process
it waited for (user + sys), the 1-minute load average before and after, the outcome line and the number
of workers, with the machine and the commit; then where the time goes, from JUnit XML: the first plain run's
tests by cost tier and file, and the suite run's scenarios by suite file (the time each budget would have to shed).

``--load N`` starts N busy processes (one pure-Python spin loop each, a core's worth of load apiece) beside every
run, the way issue 31 checks the budgets "on a 2-core machine 1.5x slower": on 2 cores one busy process leaves
the run about two thirds of the machine. The targets (README's first command within 3 minutes, plain ``pytest``
within 2 minutes) are read off the table, nothing is asserted. Run it on a quiet machine: other tenants are load
the table does not name.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import multiprocessing
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
OUTCOME = re.compile(r"=+ (.*? in [\d.]+s.*?) =+\s*$", re.M)
WORKERS = re.compile(r"created: (\d+)/\d+ workers")


def _spin() -> None:
    """A core's worth of load: a pure-Python loop, no memory traffic to speak of, until terminated."""
    while True:
        pass


@contextlib.contextmanager
def busy_cores(count: int) -> Iterator[None]:
    """``count`` spinning processes for as long as the block runs (not counted in the run's CPU time: they are
    not the run's children)."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(count)]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.terminate()
            spinner.join()


def _steal_s() -> float | None:
    """Seconds of CPU time the hypervisor gave other guests, summed over this machine's cores (``/proc/stat``'s
    ``steal``), or None where there is no such file: a run whose CPU time grew for the same tests shows it here."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if fields[0] == "cpu" and len(fields) > 8 else None


def _run(args: list[str], label: list[str], load: int, env: dict[str, str]) -> dict:
    load_before = os.getloadavg()[0]
    steal_before = _steal_s()
    with busy_cores(load):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=ROOT, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    steal_after = _steal_s()
    out = proc.stdout + proc.stderr
    outcome = OUTCOME.findall(out)
    workers = WORKERS.search(out)
    return {
        "command": " ".join(["pytest", *label]),
        "rc": proc.returncode,
        "wall_s": wall,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "workers": int(workers.group(1)) if workers else 1,
        "outcome": outcome[-1] if outcome else (out.strip().splitlines() or ["no output"])[-1],
        "load": f"{load_before:.2f} / {os.getloadavg()[0]:.2f}",  # other tenants show here: the table is not quiet
        "steal_s": None if steal_before is None or steal_after is None else steal_after - steal_before,
    }


TARGETS_S = {"pytest": 120.0, "pytest --flashckpt-suite": 180.0}  # README's two commands: 2 and 3 minutes


def _breakdown(junit: Path, wall_s: float) -> list[str]:
    """Where the first plain run's test time goes, from its JUnit XML (each test's setup + call + teardown, summed
    over the workers): by cost tier and by file, and the test time a 2-minute run would have to shed at the
    wall-to-test-time ratio this run measured."""
    times = [(case.get("classname", ""), float(case.get("time", 0))) for case in ET.parse(junit).iter("testcase")]
    total = sum(t for _, t in times)
    if not times or total <= 0:
        return []
    lines = ["## Where the first plain `pytest` run's time goes", "",
             f"{len(times)} tests, {total:.1f} s of test time (setup + call + teardown, summed over the workers) in "
             f"{wall_s:.1f} s of wall time: {wall_s / total:.3f} s of wall per second of test time.", "",
             "| tests taking | tests | test time (s) | share |", "| --- | ---: | ---: | ---: |"]
    for low, high in ((0, 0.1), (0.1, 0.5), (0.5, 1), (1, 2), (2, 5), (5, float("inf"))):
        tier = [t for _, t in times if low <= t < high]
        label = f"{low:g} s or more" if high == float("inf") else f"{low:g}-{high:g} s"
        lines.append(f"| {label} | {len(tier)} | {sum(tier):.1f} | {sum(tier) / total:.0%} |")
    by_file: dict[str, float] = defaultdict(float)
    for classname, t in times:
        by_file[classname.split(".Test")[0].replace(".", "/") + ".py"] += t
    lines += ["", "| file (the 15 costliest) | test time (s) | share |", "| --- | ---: | ---: |"]
    for name, t in sorted(by_file.items(), key=lambda kv: -kv[1])[:15]:
        lines.append(f"| `{name}` | {t:.1f} | {t / total:.0%} |")
    return lines + _to_shed(total, wall_s, TARGETS_S["pytest"], "a 2-minute plain `pytest`", "test time", "the default run")


def _suite_breakdown(junit: Path, wall_s: float) -> list[str]:
    """Where the suite run's time goes, from its JUnit XML (one test case per scenario, its class the suite file the
    scenario came from): by suite file and the costliest scenarios, and the scenario time a 3-minute run would have
    to shed at this run's wall-to-scenario-time ratio."""
    times = [(case.get("classname", ""), case.get("name", ""), float(case.get("time", 0))) for case in ET.parse(junit).iter("testcase")]
    total = sum(t for *_, t in times)
    if not times or total <= 0:
        return []
    by_suite: dict[str, list[float]] = defaultdict(list)
    for suite, _, t in times:
        by_suite[suite].append(t)
    lines = ["## Where the suite run's time goes", "",
             f"{len(times)} scenarios, {total:.1f} s of scenario time in {wall_s:.1f} s of wall time.", "",
             "| suite file | scenarios | scenario time (s) | share |", "| --- | ---: | ---: | ---: |"]
    for suite, ts in sorted(by_suite.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"| `suites/{suite}.yaml` | {len(ts)} | {sum(ts):.1f} | {sum(ts) / total:.0%} |")
    lines += ["", "| scenario (the 10 costliest) | time (s) |", "| --- | ---: |"]
    for suite, name, t in sorted(times, key=lambda row: -row[2])[:10]:
        lines.append(f"| `{suite}::{name}` | {t:.1f} |")
    return lines + _to_shed(total, wall_s, TARGETS_S["pytest --flashckpt-suite"], "a 3-minute suite run", "scenario time", "the default suite")


def _to_shed(total: float, wall_s: float, budget_s: float, run: str, time_of: str, where: str) -> list[str]:
    """The time (of ``total``, summed over what ran) that ``run`` within ``budget_s`` of wall time would have to
    shed, at this run's wall-to-summed-time ratio."""
    keep = budget_s / (wall_s / total)
    return ["", f"At this run's ratio, {run} holds {keep:.0f} s of {time_of}: {max(0.0, total - keep):.0f} s "
            f"({max(0.0, 1 - keep / total):.0%}) would have to leave {where} (or get cheaper).", ""]


def _commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return head + (" (with uncommitted changes)" if dirty else "")


def _within_targets(runs: list[dict]) -> list[str]:
    """Per command with a target: how many of its runs finished within it, and the range of their wall times."""
    lines = []
    for command, target in TARGETS_S.items():
        walls = sorted(run["wall_s"] for run in runs if run["command"] == command)
        if walls:
            within = sum(wall <= target for wall in walls)
            lines.append(f"`{command}`: {within} of {len(walls)} run(s) within {target:.0f} s "
                         f"(wall {walls[0]:.1f}-{walls[-1]:.1f} s).")
    return lines + [""] if lines else []


def _cpu() -> str:
    """The first CPU's model, family/model numbers and clock as /proc/cpuinfo gives them (Linux; else the
    platform's processor name): hosts of one profile id (``cpu-2t-torch...``) can differ, and the report says which
    one ran it."""
    try:
        text = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return platform.processor() or platform.machine()
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    get = {key.strip(): value.strip() for key, value in fields.items()}.get
    mhz = get("cpu MHz")
    return (f"{get('model name', platform.machine())} (family {get('cpu family', '?')}, model {get('model', '?')}"
            + (f", {float(mhz):.0f} MHz" if mhz else "") + ")")


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="plain pytest runs (default 2)")
    parser.add_argument("--one-process", action="store_true", help="also run pytest -n 0 once, for the comparison")
    parser.add_argument("--suite", action="store_true", help="also run README's first command, pytest --flashckpt-suite, once")
    parser.add_argument("--suite-runs", type=int, default=1, metavar="N",
                        help="with --suite: run README's first command N times (default 1; the breakdown is the first's)")
    parser.add_argument("--load", type=int, default=0, metavar="N",
                        help="N busy processes beside every run (1 on 2 cores: the 1.5x slower host of issue 31)")
    parser.add_argument("--omp-wait-policy", choices=("as-set", "libgomp-default"), default="as-set",
                        help="as-set (default): this environment's OMP_WAIT_POLICY, else the PASSIVE the suite and the "
                        "tests set (pytest_flashckpt/runner/threads.py); libgomp-default: libgomp's own spinning, "
                        "for a before/after comparison (an unknown value, which libgomp reads as its default and "
                        "names on stderr)")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "test-run-time.md")
    args = parser.parse_args()
    if args.runs < 0 or args.load < 0 or args.suite_runs < 1:
        parser.error(f"--runs and --load must be 0 or more and --suite-runs 1 or more, got --runs {args.runs} "
                     f"--load {args.load} --suite-runs {args.suite_runs}")
    env = dict(os.environ)
    if args.omp_wait_policy == "libgomp-default":
        env["OMP_WAIT_POLICY"] = "libgomp-default"
    policy = env.get("OMP_WAIT_POLICY", "PASSIVE (set by the suite and tests/conftest.py)")
    with tempfile.TemporaryDirectory(prefix="flashckpt-test-times-") as tmp:
        junit = Path(tmp) / "junit.xml"  # the first plain run's per-test times, for the breakdown below
        runs = [_run([f"--junitxml={junit}"] if i == 0 else [], [], args.load, env) for i in range(args.runs)]
        breakdown = _breakdown(junit, runs[0]["wall_s"]) if runs and junit.exists() else []
    if args.one_process:
        runs.append(_run(["-n", "0"], ["-n", "0"], args.load, env))
    for i in range(args.suite_runs if args.suite else 0):
        with tempfile.TemporaryDirectory(prefix="flashckpt-suite-timing-") as report:
            suite_junit = Path(report) / "junit.xml"
            runs.append(_run(["--flashckpt-suite", f"--flashckpt-report={report}", f"--junitxml={suite_junit}"],
                             ["--flashckpt-suite"], args.load, env))
            if i == 0 and suite_junit.exists():
                breakdown += _suite_breakdown(suite_junit, runs[-1]["wall_s"])
    if not runs:
        parser.error("nothing to time: give --runs 1 or more, --one-process or --suite")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    import torch

    beside = f" With {args.load} busy process(es) beside every run (--load {args.load})." if args.load else ""
    lines = [
        "# README's commands: wall and CPU time",
        "",
        f"Written by `python benchmarks/time_test_run.py {' '.join(sys.argv[1:])}`".rstrip() + " on "
        f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, commit {_commit()}.",
        f"Machine: {cores} cores, {_cpu()}, {platform.machine()}, Python {platform.python_version()}, "
        f"torch {torch.__version__}. CPU time is pytest's and every process it waited for (user + sys).{beside}",
        f"OpenMP wait policy: {policy}.",
        "",
        "| command | workers | wall (s) | wall | CPU (s) | CPU stolen (s) | load before / after | exit | outcome |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for run in runs:
        stolen = "—" if run["steal_s"] is None else f"{run['steal_s']:.1f}"
        lines.append(f"| `{run['command']}` | {run['workers']} | {run['wall_s']:.1f} | {_minutes(run['wall_s'])} | "
                     f"{run['cpu_s']:.1f} | {stolen} | {run['load']} | {run['rc']} | {run['outcome']} |")
    lines += ["", "Plain `pytest` is README's test command (its first part; `pytest -m slow` runs after it in CI), "
              "target 2 minutes; `-n 0` is the same tests in one process. `pytest --flashckpt-suite` is README's "
              "first command (the default suite on a CPU), target 3 minutes. *CPU stolen*: what the hypervisor gave other "
              "guests during the run (`/proc/stat` steal, all cores): the same tests take more CPU time on a "
              "virtual machine whose neighbours are busy, which the load average does not show.", ""]
    lines += _within_targets(runs)
    args.out.write_text("\n".join(lines + breakdown))
    print("\n".join(lines + breakdown))
    sys.exit(max(run["rc"] for run in runs))


if __name__ == "__main__":
    main()
