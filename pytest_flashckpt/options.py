"""The plugin's options: one registry, each a ``--flashckpt-*`` flag with an ini twin and a default shown in
``pytest --help``. Values are validated once, into a typed ``Options``; a bad value is a usage error that names
the option and the valid choices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pytest


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


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError("must be a positive integer")
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
    from pytest_flashckpt.runner.inject import Injection  # torch-free

    Injection.parse(text)  # raises ValueError naming the bad part
    return text


def _device(text: str) -> str:
    if text in ("auto", "cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise ValueError("valid: auto, cpu, cuda, cuda:N")


OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("flashckpt-device", "device to measure on: auto (CUDA when present, else CPU), cpu, cuda, cuda:N", "auto", _device),
    OptionSpec(
        "flashckpt-probe", "memory probe: auto (cpu on CPU, cuda on GPU), cpu, cuda, nvml, rss", "auto",
        choices=("auto", "cpu", "cuda", "nvml", "rss"),
    ),
    OptionSpec("flashckpt-report", "folder for results.json and the markdown report (relative to the invocation folder)", "reports"),
    OptionSpec("flashckpt-rounds", "override every scenario's interleaved timing rounds (0 = as the suite says)", 0, int),
    OptionSpec("flashckpt-saves", "override every checkpoint scenario's saves (0 = as the suite says); baselines use more", 0, int),
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
    # benchmarks/gate_power.py (reports/gate-power.md; the rates are in baselines/README.md)
    OptionSpec("flashckpt-timing-tolerance", "timing ratio change tolerated before a regression (fraction)", 0.05, _fraction),
    OptionSpec("flashckpt-memory-tolerance", "peak-memory change tolerated for sampled probes (nvml, rss) (fraction)", 0.02, _fraction),
    OptionSpec("flashckpt-alpha", "significance level of the timing regression test (one-sided Mann-Whitney U)", 0.01, _probability),
    OptionSpec(
        "flashckpt-inject",
        "inject a known regression to check the gate can fail, e.g. step=0.10 (strategy steps 10% slower), stall=0.25 "
        "(saves block 25% longer), jitter=0.3; never for real measurements (the report says so)",
        "", _injection,
    ),
    OptionSpec(
        "flashckpt-gate-times",
        "also gate absolute times (step_time_s, save_*_s, load_s), not only ratios; only for a quiet, dedicated machine",
        False, lambda t: t.lower() in ("1", "true", "yes"),
    ),
)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("flashckpt", "pytest-flashckpt: measure checkpointing strategies")
    group.addoption(
        "--flashckpt-suite",
        action="store",
        nargs="?",
        const="default",
        default=None,
        metavar="NAME|PATH",
        help="run a scenario suite (shipped name or YAML path; default suite when no value: --flashckpt-suite=NAME)",
    )
    for spec in OPTIONS:
        kind = "store_true" if isinstance(spec.default, bool) else "store"
        extra = {} if kind == "store_true" else {"metavar": spec.name.split("-", 1)[1].upper()}
        group.addoption(spec.flag, action=kind, dest=spec.dest, default=None, help=f"{spec.help} (default: {spec.default})", **extra)
        parser.addini(spec.ini, f"{spec.help} (default: {spec.default})", default=None)


@dataclass(frozen=True)
class Options:
    suite: str | None
    device: str
    probe: str
    report: str
    rounds: int
    saves: int
    workdir: str
    baseline_dir: str
    save_baseline: bool
    subset: bool
    no_compare: bool
    timing_tolerance: float
    memory_tolerance: float
    alpha: float
    inject: str
    gate_times: bool

    @classmethod
    def from_config(cls, config: pytest.Config) -> "Options":
        values: dict[str, Any] = {"suite": config.getoption("flashckpt_suite")}
        for spec in OPTIONS:
            raw = config.getoption(spec.dest)
            source = spec.flag
            if raw is None:
                raw, source = config.getini(spec.ini), f"ini {spec.ini}"
            if raw is None or raw == "":
                values[spec.dest.removeprefix("flashckpt_")] = spec.default
                continue
            if isinstance(raw, bool):
                values[spec.dest.removeprefix("flashckpt_")] = raw
                continue
            if spec.choices is not None and raw not in spec.choices:
                raise pytest.UsageError(f"{source}: {raw!r} is not valid; valid: {', '.join(spec.choices)}")
            try:
                values[spec.dest.removeprefix("flashckpt_")] = spec.parse(str(raw))
            except ValueError as exc:
                raise pytest.UsageError(f"{source}: {raw!r} is not valid: {exc}") from None
        return cls(**values)
