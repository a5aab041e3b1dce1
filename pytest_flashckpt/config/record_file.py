"""``results.json`` read back: the bytes checked, an older schema upgraded (``config.upgrade``, the one place that
knows old shapes), and each result's scenario parsed once into the typed ``Scenario`` (``typed.build``), so every
reader (report, baselines, ``flashckpt ab`` / ``history`` / ``pool-baseline``) reads attributes, never a dict.

Every problem is a ``ValueError`` naming the file, and the scenario and key where there is one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.scenario import Scenario
from pytest_flashckpt.config.typed import build
from pytest_flashckpt.config.upgrade import upgrade
from pytest_flashckpt.core.comparison import Comparison
from pytest_flashckpt.core.files import read_regular_bytes
from pytest_flashckpt.core.result import Result, RunRecord


def result_from_dict(data: dict[str, Any], where: str = "results.json") -> Result:
    """One result in the current schema (``Result.to_dict``'s form), its scenario typed."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a result must be a mapping, got {type(data).__name__}")
    if not isinstance(data.get("config"), dict):
        raise ValueError(f"{where}: result {data.get('scenario')!r}: 'config' must be the scenario's mapping")
    try:
        scenario = build(Scenario, data["config"], where, "config")
    except ConfigError as exc:  # "<where>: <key>: <problem>": the result named after the file
        text = str(exc).removeprefix(f"{where}: ")
        raise ValueError(f"{where}: result {data.get('scenario')!r}: {text}") from None
    return Result(**{**data, "config": scenario})


def record_from_dict(data: dict[str, Any], where: str = "results.json") -> RunRecord:
    """A run record from a results file's data of any supported schema (``config.upgrade``)."""
    data = dict(upgrade(data))
    results = data.get("results")
    if not isinstance(results, list):
        raise ValueError(f"{where}: 'results' must be a list, got {type(results).__name__}")
    data["results"] = [result_from_dict(r, where) for r in results]
    if data.get("comparison") is not None:
        data["comparison"] = Comparison.from_dict(data["comparison"])
    return RunRecord(**data)


def read_record(path: Path | str) -> RunRecord:
    """Load a results file; missing files, bad JSON and other schemas are ValueErrors naming the file. Only a
    regular file is opened: a FIFO named results.json would block the reader forever, a folder would raise."""
    try:
        data = json.loads(read_regular_bytes(path).decode("utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: no such results file (a suite run writes flashckpt-report/results.json)") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a JSON results file ({exc})") from None
    if not isinstance(data, dict) or "results" not in data:
        raise ValueError(f"{path}: not a pytest-flashckpt results file (no 'results' key)")
    try:
        return record_from_dict(data, str(path))
    except ValueError as exc:
        raise ValueError(exc if str(path) in str(exc) else f"{path}: {exc}") from None
    except (TypeError, AttributeError) as exc:  # a key of another shape (a text where a mapping belongs)
        raise ValueError(f"{path}: {exc}") from None
