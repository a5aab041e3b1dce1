"""A save's three axes (layout, staging, schedule) resolved from what a scenario's ``checkpoint:`` says.

What a scenario may say, read in this order:

1. ``strategy: <preset>`` (``core.registry.SAVE_PRESETS``) fills every axis the scenario does not set. ``sync``
   (or no strategy) is the default: the settings below choose the axes and the name.
2. The axis settings ``layout``, ``staging``, ``schedule`` and the article's keys, which are settings of one axis
   each: ``async_save: true`` is staging ``background``, ``select_params`` layout ``selected``,
   ``layer_checkpoint_dir`` layout ``layerwise`` (on a ``file`` layout; on ``selected`` and ``dcp`` it splits the
   full files per block), ``mem_threshold`` schedule ``memory_aware``.

A setting beside a preset overrides that axis, except the axes the preset is named for (where it differs from
``sync``): ``strategy: dcp`` with ``layout: file`` is refused, naming the key. ``staging: overlapped`` refines
``async``'s ``background`` (both are background writes) and is allowed.

The name: the preset's when one is given; with ``sync`` or none, the preset that differs from ``sync`` on exactly the
axis the settings change (``async_save: true`` is ``async``, as the seed named it), and for settings that change two
or more axes a derived ``<layout>-<staging>-<schedule>`` (``registry.derived_save_name``).

Impossible combinations are refused here, at config time, naming the key and the valid choices.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_flashckpt.core.registry import (
    NO_SAVE, SAVE_DEFAULT, SAVE_LAYOUTS, SAVE_PRESETS, SAVE_SCHEDULES, SAVE_STAGINGS, derived_save_name, save_strategy_names,
)

AXES = ("layout", "staging", "schedule")
CHOICES = {"layout": SAVE_LAYOUTS, "staging": SAVE_STAGINGS, "schedule": SAVE_SCHEDULES}


@dataclass(frozen=True)
class SaveAxes:
    """One value per axis: which files (``layout``), what the training loop waits for (``staging``), when a save
    is taken (``schedule``)."""

    layout: str = SAVE_DEFAULT.layout
    staging: str = SAVE_DEFAULT.staging
    schedule: str = SAVE_DEFAULT.schedule

    @property
    def background(self) -> bool:
        """Written by a background thread (the training loop waits for the snapshot only, or for nothing)."""
        return self.staging != "blocking"

    @property
    def overlapped(self) -> bool:
        return self.staging == "overlapped"


def preset_axes(name: str) -> SaveAxes:
    preset = SAVE_PRESETS[name]
    return SaveAxes(preset.layout, preset.staging, preset.schedule)


def _named_axes(name: str) -> list[str]:
    """The axes preset ``name`` is named for: where it differs from ``sync`` (none for sync itself)."""
    return [axis for axis in AXES if getattr(preset_axes(name), axis) != getattr(SAVE_DEFAULT, axis)]


def _owner(axis: str, value: str) -> str | None:
    """The preset that differs from ``sync`` on ``axis`` only, with ``value`` there (overlapped: async's refinement)."""
    value = "background" if (axis, value) == ("staging", "overlapped") else value
    for name in SAVE_PRESETS:
        if _named_axes(name) == [axis] and getattr(preset_axes(name), axis) == value:
            return name
    return None


def _choices(axis: str) -> str:
    return ", ".join(CHOICES[axis])


def settings_of(layout, staging, schedule, async_save, select_params, mem_threshold, layer_checkpoint_dir,
                base_layout: str) -> dict[str, tuple[str, str]]:
    """axis -> (value, the key that set it), from the axis keys and the article's keys; ``base_layout`` is the
    layout the scenario's preset gives (``layer_checkpoint_dir`` makes a ``file`` layout ``layerwise``). Two keys
    that set one axis to different values are an error."""
    given: dict[str, tuple[str, str]] = {}

    def put(axis: str, value: str, key: str) -> None:
        if axis in given and given[axis][0] != value:
            other_value, other_key = given[axis]
            raise ValueError(f"{_said(other_key, axis, other_value)} and {_said(key, axis, value)} set the {axis} two ways "
                             f"({other_value!r}, {value!r}); keep one of them")
        given.setdefault(axis, (value, key))

    for axis, value in (("layout", layout), ("staging", staging), ("schedule", schedule)):
        if value is not None:
            if value not in CHOICES[axis]:
                raise ValueError(f"{axis}: {value!r} is not a {axis}; valid: {_choices(axis)}")
            put(axis, value, axis)
    if async_save:
        if staging == "blocking":
            raise ValueError(
                "staging: blocking writes the save while training waits, but async_save: true writes it in the "
                "background; for a snapshot at the save call written by a thread use staging: background (or drop staging)"
            )
        if staging is None:
            put("staging", "background", "async_save")
    if select_params not in (None, False):
        put("layout", "selected", "select_params")
    if mem_threshold is not None:
        put("schedule", "memory_aware", "mem_threshold")
    if layer_checkpoint_dir is not None:
        if layout == "file":
            raise ValueError(
                "layer_checkpoint_dir splits a checkpoint into one file per block; layout file is one file: "
                "use layout: layerwise or drop layer_checkpoint_dir"
            )
        if given.get("layout", (base_layout,))[0] == "file":
            put("layout", "layerwise", "layer_checkpoint_dir")
    return given


def resolve(strategy: str | None, given: dict[str, tuple[str, str]]) -> tuple[str, SaveAxes]:
    """(the strategy name, its axes) for ``strategy`` (a preset, ``none``, None, or a name this returned before)
    and the settings ``given`` (``settings_of``)."""
    if strategy in (None, NO_SAVE) and not given:
        return NO_SAVE, SaveAxes()
    if strategy in SAVE_PRESETS and strategy != "sync":
        axes = preset_axes(strategy)
        for named in _named_axes(strategy):
            value, key = given.get(named, (getattr(axes, named), ""))
            ours = getattr(axes, named)
            if value != ours and (named, ours, value) != ("staging", "background", "overlapped"):
                owner = _owner(named, value) or "sync"
                raise ValueError(
                    f"{_said(key, named, value)} contradicts strategy {strategy!r}, the preset of {named} {ours!r}; drop "
                    f"{key}, or name strategy {owner!r} (or no strategy: the name then follows the settings)"
                )
        values = {axis: given[axis][0] if axis in given else getattr(axes, axis) for axis in AXES}
        return strategy, SaveAxes(**values)
    if strategy not in (None, NO_SAVE, "sync") and not _is_derived(strategy):
        raise ValueError(f"strategy: {strategy!r} is not a save strategy; valid: {', '.join(save_strategy_names())}")
    values = {axis: given[axis][0] if axis in given else getattr(SAVE_DEFAULT, axis) for axis in AXES}
    axes = SaveAxes(**values)
    changed = [axis for axis in AXES if values[axis] != getattr(SAVE_DEFAULT, axis)]
    owner = _owner(changed[0], values[changed[0]]) if len(changed) == 1 else "sync" if not changed else None
    name = owner or derived_save_name(axes.layout, axes.staging, axes.schedule)
    if strategy not in (None, NO_SAVE, "sync") and strategy != name:
        raise ValueError(
            f"strategy: {strategy!r} is not the name of these settings ({name!r}); valid strategies: "
            f"{', '.join(save_strategy_names())}"
        )
    return name, axes


def _said(key: str, axis: str, value: str) -> str:
    """How an error quotes the key that set ``axis``: ``staging: blocking``, ``select_params (layout 'selected')``."""
    return f"{key}: {value}" if key in AXES else f"{key} ({axis} {value!r})"


def _is_derived(name: object) -> bool:
    """``name`` has the shape of a derived name (``resolve`` then checks that it is the settings' own)."""
    if not isinstance(name, str) or name.count("-") != 2:
        return False
    layout, staging, schedule = name.split("-")
    return layout in SAVE_LAYOUTS and staging in SAVE_STAGINGS and schedule in SAVE_SCHEDULES


def check_combination(axes: SaveAxes, schedule_key: str | None, fmt: str, layer_checkpoint_dir: str | None,
                      mem_threshold: float | None) -> None:
    """Refuse what cannot be saved as written, naming the key and the valid choices."""
    if axes.layout == "dcp":
        if axes.staging == "overlapped":
            raise ValueError(
                "staging: overlapped overlaps the copy of a staged background save with the next step; layout dcp "
                "stages into DCP's own copy (dcp.async_save): valid stagings for layout dcp: blocking, background"
            )
        if axes.staging == "background" and layer_checkpoint_dir is not None:
            raise ValueError(
                "layer_checkpoint_dir with layout dcp writes one DCP folder per block, which only a blocking save "
                "does (dcp.async_save writes one folder): drop layer_checkpoint_dir or use staging: blocking"
            )
        if fmt != "torch":
            raise ValueError(
                f"format: {fmt} names the tensor files of the layouts file, layerwise and selected; layout dcp "
                "writes DCP's own files: drop format (or choose another layout)"
            )
    if schedule_key == "memory_aware" and mem_threshold is None:
        # the seed's ``strategy: scheduled`` without a threshold (no schedule key) stays valid: nothing to defer for
        raise ValueError(
            "schedule: memory_aware defers a save while memory in use is at or above mem_threshold; set "
            "mem_threshold (a fraction in (0, 1], e.g. 0.8)"
        )
