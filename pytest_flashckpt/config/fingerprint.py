"""A scenario's configuration fingerprint: what a baseline entry stores so that a scenario changed under the same
name (a compile setting, a new default, another norm) is "not comparable" in the gate, never "regressed".

The fingerprint is a stable hash (SHA-256 of the sorted JSON) of the scenario's resolved configuration, defaults
included (a changed default changes the numbers as surely as a changed setting), leaving out what never changes a
number's expected value:

- the labels: ``name`` and ``suite`` (the baseline's key already), ``description``, ``article``;
- the sample counts: ``rounds``, ``steps`` (timed steps per round: a round's mean over more steps scatters less, it
  does not move), ``save.saves``, ``save.time_lost_rounds`` (more rounds or saves narrow a median, they do not move
  it; the baseline recipe runs 20 rounds and 12 saves, a check run the suite's 3 and 6; the gate judges the sample
  sizes on their own, ``unguarded``);
- which passes run: ``measure`` (a metric a pass no longer measures is ``missing``, one it adds is not compared);
- the reserved axes at today's values (``config.axes``), and the axes added since fingerprints exist
  (``step_impl``) and keys added to an axis since (``compile.ac_wrapper``, ``save.wait_for_write``) at their defaults: a new axis or key
  changes no stored fingerprint until a scenario sets it; the
  layout's pipeline keys (``schedule``, ``microbatches``, ``stages_per_rank``) unless it has stages (``pp`` > 1).

Defaults a scenario leaves unset but another layer resolves at run time (``selective_op``'s save list and recompute
roles live in ``activation/``, which this layer cannot import) come in as ``resolved``: flat keys the caller adds
(``baselines.fingerprints``), so a default changed there changes the fingerprint too.

The flat form (``fingerprinted``: ``{"activation.k": 2, ...}``) is stored beside the hash, so the gate names the
keys that changed (``changed_keys``), and an entry stored while a key was still fingerprinted that is left out now
(``steps`` joined the sample counts after fingerprints existed) is compared on its flat form less what is left out
today (``same_configuration``): leaving a key out never makes a stored entry "not comparable".
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pytest_flashckpt.config.axes import RESERVED_AXES, LayoutMesh, is_today
from pytest_flashckpt.config.scenario import Scenario

LABELS = ("name", "suite", "description", "article")
SAMPLE_COUNTS = ("rounds", "steps", "save.saves", "save.time_lost_rounds")
PASSES = ("measure",)
LEFT_OUT = (*LABELS, *SAMPLE_COUNTS, *PASSES)
ADDED_AXES = ("step_impl",)  # axes added after fingerprints: left out while at their defaults
# keys added to an axis after fingerprints: left out at these defaults
ADDED_KEYS = {"compile.ac_wrapper": "inside", "layout.dp_replicate": 1, "save.wait_for_write": False}


def fingerprinted(scenario: Scenario, resolved: dict[str, Any] | None = None) -> dict[str, Any]:
    """The configuration the fingerprint hashes, flat (dotted keys, sorted), JSON-able; ``resolved``: defaults
    resolved outside this layer, as flat keys (none by default)."""
    plain = scenario.to_plain()
    for name in (*RESERVED_AXES, *ADDED_AXES):
        if is_today(getattr(scenario, name)):
            plain.pop(name)
    if "layout" in plain and scenario.layout.pp == 1:  # the pipeline keys mean nothing without stages
        for key in LayoutMesh.PIPELINE_KEYS:
            plain["layout"].pop(key)
    flat = {**_flatten(plain), **(resolved or {})}
    return {key: flat[key] for key in sorted(flat)
            if key not in LEFT_OUT and not (key in ADDED_KEYS and flat[key] == ADDED_KEYS[key])}


def same_configuration(stored_hash: str | None, stored_flat: dict[str, Any] | None, current: dict[str, Any]) -> bool:
    """Whether a stored entry (its hash and flat form) was measured with the configuration ``current`` (this run's
    ``fingerprinted``): the same hash, or the same flat form once the keys left out today are taken out of it."""
    if stored_hash == digest(current):
        return True
    if stored_flat is None:
        return False
    return {k: v for k, v in stored_flat.items() if k not in LEFT_OUT} == current


def workload_key(scenario: Scenario, with_save: bool = True) -> str:
    """The key a run's caches share measurements under (``runner.context.RunContext.cached``): the digest of the
    configuration without the labels, ``measure`` and ``rounds`` (scenarios that differ in them train the same
    step), and without the save unless ``with_save`` (only the checkpoint pass depends on it). Unlike the
    fingerprint it keeps ``save.saves``: a reference save pass of 3 saves is not one of 12."""
    flat = _flatten(scenario.to_plain())
    dropped = (*LABELS, "rounds", *PASSES)
    return digest({k: v for k, v in flat.items() if k not in dropped and (with_save or not k.startswith("save."))})


def fingerprint(scenario: Scenario, resolved: dict[str, Any] | None = None) -> str:
    """``sha256:`` and the first 16 hex digits of the hash of ``fingerprinted(scenario, resolved)``."""
    return digest(fingerprinted(scenario, resolved))


def digest(flat: dict[str, Any]) -> str:
    text = json.dumps(flat, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def changed_keys(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``key: stored -> current`` for every key whose value differs (``(absent)`` on the side that lacks it)."""
    absent = "(absent)"
    return [f"{key}: {json.dumps(stored.get(key, absent))} -> {json.dumps(current.get(key, absent))}"
            for key in sorted(stored.keys() | current.keys()) if stored.get(key, absent) != current.get(key, absent)]


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, child in value.items():
            out.update(_flatten(child, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}
