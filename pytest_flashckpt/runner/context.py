"""The run's context, resolved in one place: device (``auto`` -> CUDA when present), memory probe (``auto`` -> the
device's default), checkpoint work folder, the hardware/software profile, and the per-run cache of reference
measurements. The pytest plugin, ``flashckpt run`` and the ``flashckpt`` fixture all resolve through here."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import torch

from pytest_flashckpt.config.scenario import Scenario
from pytest_flashckpt.core.registry import default_probe_name
from pytest_flashckpt.config.injection import Injection
from pytest_flashckpt.runner.cards import CardShelf


class SkipScenario(Exception):
    """This hardware cannot run the scenario; the message is the reason shown in reports and pytest."""


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` -> the first CUDA device when there is one, else the CPU; a missing CUDA is a clear error."""
    if name == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SkipScenario(f"device {name!r} asked for, but torch {torch.__version__} sees no CUDA device")
    if device.type == "cuda":  # always an explicit index: events, probes and staging act on exactly this GPU
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        if device.index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s), cuda:0..")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {name!r}; valid: auto, cpu, cuda, cuda:N")
    return device


def resolve_probe(name: str, device: torch.device) -> str:
    return default_probe_name(device.type) if name == "auto" else name


# Fields of a scenario no cached measurement depends on: its labels, which passes it asks for, how many rounds
LABEL_FIELDS = frozenset({"name", "suite", "description", "article", "measure", "rounds"})
# Kinds no timing setting changes (steps per round): the scenarios of one model and workload share their entry
# (the activation suite's reference at 2 steps a round, the article's at 1, the attention suite's sdpa rows)
UNTIMED_KINDS = frozenset({"trainer", "memory pass", "flop count"})
SAVE_KIND = "checkpoint"  # the only kind that depends on the save settings


def _frozen(value: Any) -> Any:
    """``value`` as a hashable value of its own type where it is one (frozen dataclasses, tuples, strings,
    numbers); dicts and lists (a Hugging Face config) as sorted tuples."""
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        try:
            hash(value)
            return value
        except TypeError:
            return (type(value).__name__, tuple((f.name, _frozen(getattr(value, f.name))) for f in dataclasses.fields(value)))
    return value


@dataclasses.dataclass(frozen=True)
class CacheKey:
    """What a run's cached measurement of ``kind`` depends on, from the scenario's typed fields: every field but the
    labels (``LABEL_FIELDS``), the save unless the kind is the checkpoint pass, ``steps`` for the untimed kinds, and
    no activation options when no activation strategy runs (a ``none`` scenario's ``k`` changes nothing). A field a
    scenario gains later (a compile or layout axis) is in the key without anyone listing it."""

    kind: str
    workload: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, kind: str, scenario: Scenario) -> "CacheKey":
        left_out = LABEL_FIELDS | ({"steps"} if kind in UNTIMED_KINDS else set()) | (set() if kind == SAVE_KIND else {"save"})
        workload = []
        for f in dataclasses.fields(scenario):
            if f.name in left_out:
                continue
            value = getattr(scenario, f.name)
            if f.name == "activation" and scenario.is_reference:
                value = "none"
            workload.append((f.name, _frozen(value)))
        return cls(kind, tuple(workload))


@dataclasses.dataclass
class RunContext:
    """Per-run settings and caches shared by the scenarios of one suite run."""

    device: torch.device
    probe: str
    workdir: Path | None = None
    cache: dict[str, Any] = dataclasses.field(default_factory=dict)  # per-run caches keyed by text (the roofline's)
    measured: dict[CacheKey, Any] = dataclasses.field(default_factory=dict)  # ``cached``: shared measurements
    dtypes: tuple[str, ...] = ("float32",)  # the scenarios' dtypes: the profile's kernel is resolved with the most common
    inject: Injection | None = None  # a known regression on purpose, to check the gate can fail (config/injection.py)
    # told the phase a scenario is in ("memory pass", "timing round 3/5", "save 2/6"): front ends print a heartbeat
    on_phase: Callable[[str], None] | None = None
    # asked after a timing pass's first look (the scenario's result so far, its per-round overhead samples): how many
    # confirmation rounds to add before it is judged (``runner.passes.timing_pass``); the suite run's gate answers
    more_rounds: Callable[[Any, list[float]], int] | None = None
    cards: CardShelf = dataclasses.field(default_factory=CardShelf)  # the run's model cards, each read once
    _profile: tuple[dict[str, Any], str] | None = None

    @classmethod
    def resolve(
        cls, device: str = "auto", probe: str = "auto", workdir: str | Path | None = None, inject: str = "",
        cards: CardShelf | None = None,
    ) -> "RunContext":
        dev = resolve_device(device)
        return cls(device=dev, probe=resolve_probe(probe, dev), workdir=Path(workdir) if workdir else None,
                   inject=Injection.parse(inject), cards=cards if cards is not None else CardShelf())

    def phase(self, text: str) -> None:
        """Say which phase the running scenario is in (a no-op unless a front end listens)."""
        if self.on_phase is not None:
            self.on_phase(text)

    def cached(self, kind: str, scenario: Scenario, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per kind and workload (``CacheKey``): only the checkpoint kind depends on the save
        settings, so the other kinds share one entry across scenarios that differ in their save alone, and the
        untimed ones (trainer, memory pass, FLOP count) across scenarios that differ in their steps per round."""
        key = CacheKey.of(kind, scenario)
        if key not in self.measured:
            self.measured[key] = compute()
        return self.measured[key]

    def profile(self) -> tuple[dict[str, Any], str]:
        """This run's hardware/software profile and its id (computed once)."""
        if self._profile is None:
            from pytest_flashckpt.runner.profile import current_profile, profile_id, run_kernel

            profile = current_profile(str(self.device), run_kernel(self.device, self.dtypes))
            self._profile = (profile, profile_id(profile))
        return self._profile
