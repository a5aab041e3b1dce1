"""Suite files (``suites/<name>.yaml``): named lists of scenarios, with shared defaults, matrices and includes.

    name: attention
    description: ...
    defaults: {model: tiny, batch_size: 4}        # merged under every scenario (nested mappings deep-merged)
    include: [other-suite]                          # scenarios of other suites, run as part of this one

Relative paths in a suite (an ``include`` path, ``model: cards/x.yaml``, ``model.card``, ``model.hf: config.json``)
name files next to the suite, wherever it is run from: a file of the same name in the current folder is never
taken instead (``_anchor_paths``).
    scenarios:
      - name: reference
      - name: "{attention}-s{seq_len}"              # a template filled from each matrix combination
        matrix: {attention: [eager, sdpa], seq_len: [512, 1024]}   # dotted keys reach nested fields
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_flashckpt.config.data import anchored, names_a_file, resolve
from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.scenario import Scenario
from pytest_flashckpt.config.typed import build, load_yaml
from pytest_flashckpt.core.files import shown_path

_SUITE_KEYS = ("name", "description", "defaults", "include", "scenarios")


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    path: Path
    scenarios: tuple[Scenario, ...]
    origins: dict[str, str] = field(default_factory=dict, compare=False)  # scenario id -> the file it came from

    def origin(self, scenario: Scenario) -> str:
        """The file ``scenario`` was written in (an included suite's file for its scenarios), as errors show it."""
        return self.origins.get(f"{scenario.suite}::{scenario.name}", shown_path(self.path))


AUTO_SUITE = "auto"  # what ``--flashckpt-suite`` with no value means


def default_suite_for(device: str) -> str:
    """The suite ``--flashckpt-suite`` runs with no value: ``gpu`` (bf16, flash-attn, GPU sizes) when ``device``
    is CUDA, ``default`` (the CPU suite) otherwise. ``auto`` looks for a CUDA device (imports torch)."""
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return "gpu" if device.startswith("cuda") else "default"


def load_suite(name_or_path: str, _seen: tuple[str, ...] = ()) -> Suite:
    """Load and validate a suite by shipped name or path; every scenario is fully typed and checked."""
    if Path(name_or_path).is_dir():
        raise ConfigError(str(name_or_path), "is a directory, not a suite file", "name a suite .yaml file or a shipped suite name")
    path = resolve("suites", name_or_path)
    where = shown_path(path)
    if path.resolve().as_posix() in _seen:
        raise ConfigError(where, f"include cycle: {' -> '.join(_seen)} -> {path}")
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(where, "a suite file must be a mapping with 'scenarios' (and optionally name, defaults, include)")
    unknown = sorted(set(data) - set(_SUITE_KEYS))
    if unknown:
        raise ConfigError(where, f"unknown key {unknown[0]!r}", f"valid keys: {', '.join(_SUITE_KEYS)}")
    suite_name = data.get("name", path.stem)
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ConfigError(where, "defaults must be a mapping of scenario fields")
    scenarios: list[Scenario] = []
    origins: dict[str, str] = {}
    for i, included in enumerate(data.get("include") or []):
        if isinstance(included, str) and names_a_file(included):
            included = anchored(included, path.parent)
        try:
            other = load_suite(str(included), (*_seen, path.resolve().as_posix()))
        except ConfigError as exc:
            raise (exc.within(where, key=f"include[{i}]") if not exc.where else exc) from None
        scenarios.extend(other.scenarios)
        origins.update({f"{s.suite}::{s.name}": other.origin(s) for s in other.scenarios})
    entries = data.get("scenarios") or []
    if not isinstance(entries, list):
        raise ConfigError(where, "scenarios must be a list of mappings")
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ConfigError(where, f"scenarios[{index}] must be a mapping, got {type(entry).__name__}")
        for expanded in _expand(entry, where, index):
            merged = _anchor_paths(_deep_merge(defaults, expanded), path.parent)
            merged.setdefault("suite", suite_name)
            try:
                scenario = build(Scenario, merged, where)
            except ConfigError as exc:
                raise exc.within(where, str(merged.get("name"))) from None
            scenarios.append(scenario)
            origins[f"{scenario.suite}::{scenario.name}"] = where
    if not scenarios:
        raise ConfigError(where, "the suite has no scenarios")
    seen: dict[str, int] = {}
    for i, scenario in enumerate(scenarios):
        key = f"{scenario.suite}::{scenario.name}"
        if key in seen:
            raise ConfigError(where, f"scenario name {key!r} is used twice", "give each scenario (or matrix template) a unique name")
        seen[key] = i
    return Suite(suite_name, data.get("description", ""), path, tuple(scenarios), origins)


def _expand(entry: dict[str, Any], where: str, index: int) -> list[dict[str, Any]]:
    """One scenario per combination of the entry's ``matrix``; ``name`` is formatted with the combination."""
    matrix = entry.get("matrix")
    base = {k: v for k, v in entry.items() if k != "matrix"}
    if "name" not in base:
        raise ConfigError(where, f"scenarios[{index}] has no name", "add name: <id> (a template such as '{attention}-s{seq_len}' with a matrix)")
    if matrix is None:
        return [base]
    if not isinstance(matrix, dict) or not all(isinstance(v, list) and v for v in matrix.values()):
        raise ConfigError(where, "must map keys to non-empty lists of values", scenario=str(base["name"]), key="matrix")
    out = []
    for combo in itertools.product(*matrix.values()):
        values = dict(zip(matrix, combo))
        scenario = dict(base)
        for dotted, value in values.items():
            scenario = _deep_merge(scenario, _nest(dotted, value))
        fill = {k.rsplit(".", 1)[-1]: v for k, v in values.items()} | {k.replace(".", "_"): v for k, v in values.items()}
        try:
            scenario["name"] = str(base["name"]).format(**fill)
        except (KeyError, IndexError) as exc:
            raise ConfigError(where, f"the template uses {exc}, which is not a matrix key", f"matrix keys: {', '.join(fill)}",
                              scenario=str(base["name"]), key="name") from None
        out.append(scenario)
    return out


def _anchor_paths(scenario: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``scenario`` with its relative model paths (a card file, ``model.card``, a ``model.hf`` config.json) made to
    name the files in ``folder``, the suite's: read from the current folder, a decoy of the same name there would
    be measured under the suite's scenario names. Shipped card names (``tiny``) are names, not paths."""
    model = scenario.get("model")
    if isinstance(model, str) and names_a_file(model):
        return {**scenario, "model": anchored(model, folder)}
    if not isinstance(model, dict):
        return scenario
    model = dict(model)
    if isinstance(model.get("card"), str) and names_a_file(model["card"]):
        model["card"] = anchored(model["card"], folder)
    if isinstance(model.get("hf"), str):
        model["hf"] = anchored(model["hf"], folder)
    return {**scenario, "model": model}


def _nest(dotted: str, value: Any) -> dict[str, Any]:
    head, _, rest = dotted.partition(".")
    return {head: _nest(rest, value) if rest else value}


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged
