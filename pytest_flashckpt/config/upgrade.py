"""The one place older files are read: ``upgrade`` brings a results file (``results.json``) or a baseline file of an
older schema to the current one, as plain data, before anything parses it. Nothing else knows an old shape.

Results, schema 1 -> 2:
  - a result's per-save samples and per-rank values written as ``<metric>_samples`` / ``<metric>_per_rank`` keys of
    ``samples`` (before one sample convention) move under the metric's own name, in ``samples`` / ``per_rank``;
  - a scenario's save config under ``checkpoint`` (files of version 0.1.0) moves to ``save``;
  - a save config written before the three save axes (no ``layout`` / ``schedule`` key) recorded the staging
    default as ``staging: blocking``; it was not a setting, so it is dropped (the preset's staging applies);
  - the run's wall time (``wall_time_s``) was not recorded: None.
Baselines, schema 1 -> 2: entries had no configuration fingerprint (``fingerprint``, ``config``): they stay without
one, and the gate compares them as before (it says so); the next save stores it.
"""

from __future__ import annotations

import copy
from typing import Any

from pytest_flashckpt.core.metrics import METRICS
from pytest_flashckpt.core.result import SCHEMA_VERSION as RESULTS_SCHEMA

BASELINE_SCHEMA = 2
"""2: each entry stores its scenario's configuration fingerprint (``config.fingerprint``)."""

_LEGACY_SUFFIXES = {"_samples": "samples", "_per_rank": "per_rank"}


class UnsupportedSchema(ValueError):
    """A file of a schema this version cannot read (a newer one, or one never written)."""


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a results file: a ``results`` list; a baseline file: a ``scenarios`` mapping) in the current schema,
    as a new mapping; ``UnsupportedSchema`` naming the versions this one reads otherwise."""
    kind, current = ("results", RESULTS_SCHEMA) if "results" in data else ("baseline", BASELINE_SCHEMA)
    version = data.get("schema_version")
    if version == current:
        return data
    if version != 1:
        raise UnsupportedSchema(f"{kind} schema_version {version!r} is not supported (this version reads 1 to {current})")
    out = copy.deepcopy(data)
    out["schema_version"] = current
    if kind == "results":
        out.setdefault("wall_time_s", None)
        out["results"] = [_result_v1(r) if isinstance(r, dict) else r for r in out["results"]] if isinstance(out["results"], list) else out["results"]
    return out


def _result_v1(result: dict[str, Any]) -> dict[str, Any]:
    samples, per_rank = result.get("samples"), result.get("per_rank")
    if isinstance(samples, dict) and isinstance(per_rank or {}, dict):
        result["samples"], result["per_rank"] = _legacy_lists(samples, per_rank or {})
    config = result.get("config")
    if isinstance(config, dict):
        if "checkpoint" in config and "save" not in config:
            config["save"] = config.pop("checkpoint")
        save = config.get("save")
        if isinstance(save, dict) and "layout" not in save and "schedule" not in save and save.get("staging") == "blocking":
            save["staging"] = None
    return result


def _legacy_lists(samples: dict[str, list], per_rank: dict[str, list]) -> tuple[dict[str, list], dict[str, list]]:
    """``samples`` and ``per_rank`` with the old ``<metric>_samples`` / ``<metric>_per_rank`` keys moved under the
    metric's own name; every other key stays where it was."""
    out: dict[str, dict[str, list]] = {"samples": {}, "per_rank": dict(per_rank)}
    for key, values in samples.items():
        for suffix, where in _LEGACY_SUFFIXES.items():
            if key.endswith(suffix) and key[: -len(suffix)] in METRICS:
                out[where][key[: -len(suffix)]] = values
                break
        else:
            out["samples"][key] = values
    return out["samples"], out["per_rank"]
