"""The run's options, pytest-free: one registry of ``OptionSpec`` (a ``--flashckpt-*`` flag in pytest with an ini
twin, a ``--*`` flag of ``flashckpt run``) and the typed ``Options`` a suite run reads. Values are validated once;
a bad value is an ``OptionError`` naming the option (or ini key) and the valid choices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pytest_flashckpt.config.injection import Injection
from pytest_flashckpt.core.registry import PROBE_NAMES, PROBES


class OptionError(ValueError):
    """A bad option value; the message names where it came from and what is valid."""


@dataclass(frozen=True)
class OptionSpec:
    name: str  # flag without the leading dashes; the ini key is the same with underscores
    help: str
    default: Any
    parse: Callable[[str], Any] = str
    choices: tuple[str, ...] | None = None

    @property
    def flag(self) -> str:
        return f"--{self.name}"

    @property
    def ini(self) -> str:
        return self.name.replace("-", "_")

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be 0 (as the suite says) or a positive number of rounds")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise ValueError("must be a fraction in [0, 1), e.g. 0.05 for 5%")
    return value


def _probability(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise ValueError("must be a probability in (0, 1), e.g. 0.01")
    return value


def _injection(text: str) -> str:
    Injection.parse(text)  # raises ValueError naming the bad part
    return text


def _includes(text: str) -> tuple[str, ...]:
    """Comma-separated results files of other suite runs, each read now (a missing or bad file fails the run before
    it measures anything, naming the file)."""
    from pytest_flashckpt.config.record_file import read_record

    paths = tuple(p.strip() for p in text.split(",") if p.strip())
    for path in paths:
        record = read_record(path)  # ValueError naming the file
        if not any(getattr(r.config, "compile", None) is not None and r.config.compile.enabled for r in record.results):
            raise ValueError(f"{path} (suite {record.suite}) holds no compiled scenario, which is what a report "
                             "includes from another run; name a compiled suite's results.json (reports/compiled/results.json)")
    return paths


def _device(text: str) -> str:
    if text in ("auto", "cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise ValueError("valid: auto, cpu, cuda, cuda:N")


# A run's output never lands on committed files: its own folder, named after the tool so it cannot collide with a
# project's reports/, visible because people open the report, and ignored by git (a .gitignore inside when the run
# creates it, as pytest's cache folder does; README "How to read the report")
DEFAULT_REPORT_DIR = "flashckpt-report"

OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("flashckpt-device", "device to measure on: auto (CUDA when present, else CPU), cpu, cuda, cuda:N", "auto", _device),
    OptionSpec(
        "flashckpt-probe",
        "memory probe: auto (cpu on CPU, cuda on GPU); " + "; ".join(f"{p.name} ({p.description})" for p in PROBES.values()),
        "auto",
        choices=("auto", *PROBE_NAMES),
    ),
    OptionSpec("flashckpt-report", "folder for results.json and the markdown report (relative to the invocation folder)", DEFAULT_REPORT_DIR),
    OptionSpec(
        "flashckpt-include",
        "results.json files of other suite runs (comma-separated, relative to the invocation folder) whose compiled "
        "rows this run's report shows, with each run's suite, commit and times; they are not gated by this run "
        "(the sample includes reports/compiled/results.json)",
        (), _includes,
    ),
    OptionSpec("flashckpt-rounds", "override every scenario's interleaved timing rounds (0 = as the suite says)", 0, _non_negative_int),
    OptionSpec("flashckpt-saves", "override every checkpoint scenario's saves (0 = as the suite says); baselines use more", 0, _non_negative_int),
    OptionSpec(
        "flashckpt-confirm-rounds",
        "timing rounds added to a scenario whose first rounds read slower than its baseline, before it is judged on "
        "all of them (0 = never; docs/running.md, 'Confirmation rounds')",
        5, _non_negative_int,
    ),
    OptionSpec("flashckpt-workdir", "folder for temporary checkpoints (default: the system temp folder)", ""),
    OptionSpec("flashckpt-baseline-dir", "folder of <profile>.json baselines, relative to the invocation folder", "baselines"),
    OptionSpec("flashckpt-save-baseline", "write/update this profile's baseline with the scenarios that ran", False, lambda t: t.lower() in ("1", "true", "yes")),
    OptionSpec(
        "flashckpt-subset",
        "this run measures a subset of the suite on purpose: baseline scenarios it did not measure are reported "
        "'missing' but do not fail it (-k/-m deselection implies it)",
        False, lambda t: t.lower() in ("1", "true", "yes"),
    ),
    OptionSpec("flashckpt-no-compare", "do not compare with the stored baseline", False, lambda t: t.lower() in ("1", "true", "yes")),
    # 0.05 with p < alpha: the effect size worth failing CI for; how often a 10% slowdown and a 25% longer stall are
    # caught at the shipped settings, and how often an unchanged run is flagged, is measured by
    # benchmarks/gate_power.py (reports/gate-power.md; the rates are in baselines/README.md). Against a stored baseline
    # a ratio is judged at no less than its measured run-to-run drift (Metric.run_drift: overhead 10%, stall_vs_copy
    # 15%; reports/run-drift*.md); flashckpt ab keeps this tolerance
    OptionSpec("flashckpt-timing-tolerance", "timing ratio change tolerated before a regression (fraction)", 0.05, _fraction),
    OptionSpec("flashckpt-memory-tolerance", "peak-memory change tolerated for sampled probes (nvml, rss) (fraction)", 0.02, _fraction),
    OptionSpec("flashckpt-alpha", "significance level of the timing regression test (one-sided Mann-Whitney U)", 0.01, _probability),
    OptionSpec(
        "flashckpt-inject",
        "inject a known regression to check the gate can fail, e.g. step=0.10 (strategy steps a tenth slower), "
        "stall=0.25 (saves block a quarter longer), jitter=0.3; never for real measurements (the terminal says so)",
        "", _injection,
    ),
    OptionSpec(
        "flashckpt-gate-times",
        "also gate absolute times (step_time_s, save_*_s, load_s), not only ratios; only for a quiet, dedicated machine",
        False, lambda t: t.lower() in ("1", "true", "yes"),
    ),
)


@dataclass(frozen=True)
class Options:
    suite: str | None
    device: str = "auto"
    probe: str = "auto"
    report: str = DEFAULT_REPORT_DIR
    include: tuple[str, ...] = ()
    rounds: int = 0
    saves: int = 0
    confirm_rounds: int = 5
    workdir: str = ""
    baseline_dir: str = "baselines"
    save_baseline: bool = False
    subset: bool = False
    no_compare: bool = False
    timing_tolerance: float = 0.05
    memory_tolerance: float = 0.02
    alpha: float = 0.01
    inject: str = ""
    gate_times: bool = False

    @classmethod
    def from_lookup(cls, suite: str | None, lookup: Callable[[OptionSpec], tuple[Any, str]]) -> "Options":
        """Options from ``lookup(spec) -> (raw value or None, where it came from)``; OptionError on a bad value."""
        values: dict[str, Any] = {"suite": suite}
        for spec in OPTIONS:
            raw, source = lookup(spec)
            key = spec.dest.removeprefix("flashckpt_")
            if raw is None or raw == "":
                values[key] = spec.default
            elif isinstance(raw, bool):
                values[key] = raw
            elif spec.choices is not None and raw not in spec.choices:
                raise OptionError(f"{source}: {raw!r} is not valid; valid: {', '.join(spec.choices)}")
            else:
                try:
                    values[key] = spec.parse(str(raw))
                except ValueError as exc:
                    raise OptionError(f"{source}: {raw!r} is not valid: {exc}") from None
        return cls(**values)
