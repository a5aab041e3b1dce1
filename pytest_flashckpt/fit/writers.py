"""The chosen layout written out: a suite scenario (``--write-scenario F.yaml``) the project's suite loader reads, and
a torchtitan-style config (``--write-torchtitan F.toml``) with the keys torchtitan's ``JobConfig`` reads.

The scenario is a simulated one (``simulate: {enabled: true}``: the step on meta, per rank of ``world_size``
ranks) at the layout's per-rank microbatch, strategy and precision, with every axis of the layout (HSDP replicas,
tensor parallel, context parallel, pipeline stages with their schedule, microbatches and stages per rank) in the
scenario's ``layout`` axis (FSDP alone is that axis's default: nothing to write), which the simulate suite runs as
that layout's rank (the engine under fake mode, ``simulate.layouts.run_engine_scenario``; the first and the last
pipeline rank with stages, as fit reads a pipeline candidate). Both files are checked before they replace anything:
the scenario by ``config.suites.load_suite``, the TOML by ``tomllib`` and fit's own torchtitan reader
(``fit.model_input``: what fit writes, fit reads back); a file that does not read back is never left behind.
"""

from __future__ import annotations

import os
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

import yaml

from pytest_flashckpt.config.errors import ConfigError, InputError
from pytest_flashckpt.config.suites import load_suite
from pytest_flashckpt.fit.candidates import Candidate
from pytest_flashckpt.fit.model_input import TORCHTITAN_MODELS, TORCHTITAN_SCHEDULES, read_torchtitan_toml

TORCHTITAN_FLAVORS = {card: model for model, card in TORCHTITAN_MODELS.items()}
TORCHTITAN_SCHEDULE_NAMES = {ours: theirs for theirs, ours in TORCHTITAN_SCHEDULES.items()}


@dataclass(frozen=True)
class ScenarioFile:
    path: Path
    layout_in_axis: bool  # True: a layout other than FSDP alone, written in the scenario's layout axis


def scenario_name(card_name: str, c: Candidate, seq_len: int) -> str:
    return f"{card_name}-{c.describe().replace(' x ', '-').replace(' ', '')}-mb{c.microbatch}-{c.strategy}-s{seq_len}"


def layout_axis(c: Candidate) -> dict:
    """The scenario's ``layout`` keys for ``c`` (``config.axes.LayoutMesh``): the ranks per axis above 1 (dp_shard
    always), and with stages their schedule, microbatches (the step's accumulation) and stages per rank."""
    axis = {"dp_replicate": c.dp_replicate} if c.dp_replicate > 1 else {}
    axis |= {"dp_shard": c.dp_shard, "tp": c.tp} | ({"cp": c.cp} if c.cp > 1 else {})
    if c.pp > 1:
        axis |= {"pp": c.pp, "schedule": c.schedule, "microbatches": c.accumulation}
        axis |= {"stages_per_rank": c.stages_per_rank} if c.stages_per_rank != 1 else {}
    return axis


def scenario_entry(card_name: str, c: Candidate, seq_len: int, *, with_layout: bool) -> dict:
    """One simulate-suite scenario of ``c``: the batch is the data-parallel ranks' (every replica's rows; a pipeline's
    microbatches are its rows, so its batch is the step's), tensor-parallel and cp ranks share their group's."""
    rows = c.microbatch * (c.accumulation if c.pp > 1 else 1)
    entry = {
        "name": scenario_name(card_name, c, seq_len),
        "description": f"flashckpt fit: {c.describe()}, microbatch {c.microbatch} x accumulation {c.accumulation}, "
                       f"reshard_after_forward {str(c.reshard_after_forward).lower()}",
        "model": card_name,
        "dtype": "bfloat16",
        "precision": c.precision,
        "batch_size": rows * (c.dp if with_layout else c.dp_shard),
        "seq_len": seq_len,
        "activation": {"strategy": c.strategy, "k": c.k},
        "simulate": {"enabled": True, "kernel": "flash", "target": "cuda",
                     "world_size": c.dp * c.tp * c.cp * c.pp if with_layout else c.dp_shard},
    }
    if with_layout:
        entry["layout"] = layout_axis(c)
    return entry


def _replace_checked(path: Path, text: str, check) -> None:
    """Write ``text`` beside ``path`` under its name, ``check`` it there, then move it into place (never a file
    that fails the check at ``path``)."""
    if path.is_dir() or not path.parent.is_dir():
        raise InputError(f"{path}: {'is a folder' if path.is_dir() else 'its folder does not exist'}; name the file to write")
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".fit-") as tmp:
        staged = Path(tmp) / path.name
        staged.write_text(text, encoding="utf-8")
        check(staged)
        os.replace(staged, path)


def write_scenario(path: Path, card_name: str, c: Candidate, seq_len: int, summary: str) -> ScenarioFile:
    """The suite file at ``path`` (a ``.yaml``), loadable by ``config.suites.load_suite`` (see the module doc)."""
    if path.suffix not in (".yaml", ".yml"):
        raise InputError(f"--write-scenario {path}: a suite file ends in .yaml; name it e.g. fit.yaml")
    header = f"# Written by flashckpt fit: {summary}\n"
    with_layout = c.tp > 1 or c.cp > 1 or c.pp > 1 or c.dp_replicate > 1  # FSDP alone: the axis's default
    suite = {"name": path.stem, "description": f"flashckpt fit's chosen layout: {summary}",
             "scenarios": [scenario_entry(card_name, c, seq_len, with_layout=with_layout)]}
    try:
        _replace_checked(path, header + yaml.safe_dump(suite, sort_keys=False), load_suite)
    except ConfigError as exc:
        raise InputError(f"--write-scenario {path}: the scenario does not load: {exc}") from None
    return ScenarioFile(path, with_layout)


def torchtitan_toml(card_name: str, c: Candidate, seq_len: int, summary: str, save_interval_steps: int | None = None) -> str:
    """A torchtitan job config for ``c`` (``[model]``, ``[training]``, ``[parallelism]``, ``[activation_checkpoint]``,
    ``[checkpoint]``); a card torchtitan has no flavor for is named in a comment."""
    model = TORCHTITAN_FLAVORS.get(card_name)
    lines = [f"# Written by flashckpt fit: {summary}", "", "[model]"]
    if model is None:
        lines += [f"# model card {card_name!r} has no torchtitan flavor known here: register it in torchtitan and name it",
                  'name = "llama3"', f'flavor = "{card_name}"']
    else:
        lines += [f'name = "{model[0]}"', f'flavor = "{model[1]}"']
    local = c.microbatch * (c.accumulation if c.pp > 1 else 1)  # a pipeline's microbatches are its local batch's
    lines += ["", "[training]", f"seq_len = {seq_len}", f"local_batch_size = {local}",
              f"global_batch_size = {c.microbatch * c.accumulation * c.dp}",
              (f"# pipeline: {c.accumulation} microbatches of {c.microbatch} per step" if c.pp > 1 else
               f"# gradient accumulation: {c.accumulation} microbatches per step (global / (local x data-parallel degree))"),
              'mixed_precision_param = "bfloat16"',
              f'mixed_precision_reduce = "{"float32" if c.precision == "mixed" else "bfloat16"}"']
    if c.precision == "pure":
        lines.append("# precision pure: bf16 parameters and optimizer state; torchtitan keeps float32 master weights")
    lines += ["", "[parallelism]", f"data_parallel_replicate_degree = {c.dp_replicate}",
              f"data_parallel_shard_degree = {c.dp_shard}", f"tensor_parallel_degree = {c.tp}",
              f"pipeline_parallel_degree = {c.pp}", f"context_parallel_degree = {c.cp}",
              *([f'pipeline_parallel_schedule = "{TORCHTITAN_SCHEDULE_NAMES[c.schedule]}"',
                 f"pipeline_parallel_microbatch_size = {c.microbatch}"] if c.pp > 1 else []),
              f'fsdp_reshard_after_forward = "{"default" if c.reshard_after_forward else "never"}"',
              "", "[activation_checkpoint]"]
    if c.strategy in ("none", "full"):
        lines.append(f'mode = "{c.strategy}"')
    elif c.strategy == "selective_op":
        lines += ['mode = "selective"', 'selective_ac_option = "op"']
    else:
        lines += ['mode = "selective"', f'selective_ac_option = "{c.k}"']
    if save_interval_steps is not None:
        lines += ["", "[checkpoint]", "enable_checkpoint = true", 'async_mode = "async"',
                  f"interval = {save_interval_steps}  # Young's interval for the stated MTBF and storage bandwidth"]
    return "\n".join(lines) + "\n"


def write_torchtitan(path: Path, text: str) -> Path:
    if path.suffix != ".toml":
        raise InputError(f"--write-torchtitan {path}: a torchtitan config ends in .toml; name it e.g. fit.toml")

    def check(staged: Path) -> None:
        model = tomllib.loads(staged.read_text(encoding="utf-8")).get("model", {})
        if (model.get("name"), model.get("flavor")) in TORCHTITAN_MODELS:  # a known flavor: fit reads it back
            try:
                read_torchtitan_toml(staged)
            except InputError as exc:
                raise InputError(f"--write-torchtitan {path}: the config does not read back: {exc}") from None

    _replace_checked(path, text, check)
    return path
