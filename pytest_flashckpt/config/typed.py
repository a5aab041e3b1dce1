"""Build typed dataclasses from plain mappings (YAML), with errors that name the key path and valid choices.

One mechanism for every config object (model cards, scenarios, strategy configs): field types come from the
dataclass annotations (``int``, ``float``, ``bool``, ``str``, ``Literal[...]``, ``X | None``, ``list[X]``,
``tuple[X, ...]`` and nested dataclasses); value checks live in each dataclass's ``__post_init__`` and raise
``ValueError``, which is re-raised here as a ``ConfigError`` carrying the file and key path. NaN and infinity
(YAML's ``.nan`` / ``.inf``) are refused in every number and mapping field, naming the key.
Aliases (the article's key names) are declared per dataclass in a ``ALIASES`` class attribute mapping an
accepted key to ``(field, converter)``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from typing import Any, Callable, Literal, TypeVar, get_args, get_origin, get_type_hints

import yaml

from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.strict_yaml import Refused, StrictLoader

T = TypeVar("T")


def build(cls: type[T], data: Any, where: str, path: str = "") -> T:
    """Instantiate dataclass ``cls`` from mapping ``data`` found in ``where`` at key ``path``."""
    if not isinstance(data, dict):
        raise ConfigError(where, f"{path or 'top level'} must be a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    aliases: dict[str, tuple[str, Any]] = getattr(cls, "ALIASES", {})
    values: dict[str, Any] = {}
    for key, raw in data.items():
        key_path = f"{path}.{key}" if path else str(key)
        if key in aliases:
            field_name, convert = aliases[key]
            try:
                converted = convert(raw)
            except (TypeError, ValueError) as exc:
                raise ConfigError(where, f"{key_path}: {exc}") from None
            for name, value in converted.items():
                values.setdefault(name, coerce(hints[name], value, where, key_path) if name in hints else value)
            continue
        if key not in fields:
            valid = sorted(set(fields) | set(aliases))
            raise ConfigError(where, f"unknown key {key_path!r}", f"valid keys: {', '.join(valid)}")
        values[key] = coerce(hints[key], raw, where, key_path)
    try:
        return cls(**values)
    except (ValueError, TypeError) as exc:  # TypeError: a required field is missing
        raise ConfigError(where, _placed(path, str(exc))) from None


def _placed(path: str, message: str) -> str:
    """``path: message``, unless the message already starts with the key (``activation.k must be ...``)."""
    if not path or message.startswith((path + ".", path + ":", path + " ", path.rsplit(".", 1)[-1] + ".")):
        return message
    return f"{path}: {message}"


def coerce(tp: Any, value: Any, where: str, path: str) -> Any:
    """Check ``value`` against annotation ``tp``; return it converted (nested dataclasses, tuples)."""
    origin = get_origin(tp)
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            raise ConfigError(where, f"{path}: {_brief(value)} is not a valid choice", f"valid: {', '.join(map(str, choices))}")
        return value
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(get_args(tp), value, where, path)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(where, f"{path}: expected a list, got {type(value).__name__} {_brief(value)}")
        (item_tp, *_) = get_args(tp) or (Any,)
        items = [coerce(item_tp, v, where, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if dataclasses.is_dataclass(tp):
        return value if isinstance(value, tp) else build(tp, value, where, path)
    if tp is dict or origin is dict:
        tp = dict
    if tp in _SCALARS:
        return _coerce_scalar(tp, value, where, path)
    raise TypeError(f"unsupported config annotation {tp!r} at {path}")


def _coerce_union(options: tuple, value: Any, where: str, path: str) -> Any:
    """``X | Y | None``: None where allowed, else the first option ``value`` fits; the first option's error when
    none does."""
    if value is None and type(None) in options:
        return None
    errors = []
    for option in options:
        if option is type(None):
            continue
        try:
            return coerce(option, value, where, path)
        except ConfigError as exc:
            errors.append(exc)
    raise errors[0]


# annotation -> (what it accepts, how an error names it); bool is refused where a number is expected
_SCALARS: dict[Any, tuple[Callable[[Any], bool], str]] = {
    Any: (lambda v: True, "anything"),
    float: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    bool: (lambda v: isinstance(v, bool), "true or false"),
    str: (lambda v: isinstance(v, str), "a string"),
    dict: (lambda v: isinstance(v, dict), "a mapping"),
}


def _coerce_scalar(tp: Any, value: Any, where: str, path: str) -> Any:
    """A value of one of ``_SCALARS``' annotations: checked, NaN and infinity refused where a number may hide (a
    float, a mapping, ``Any``), converted (an int given for a float, a mapping copied)."""
    accepts, expected = _SCALARS[tp]
    if not accepts(value):
        raise ConfigError(where, f"{path}: expected {expected}, got {type(value).__name__} {_brief(value)}")
    if tp in (Any, float, dict):
        refuse_non_finite(value, where, path)
    if tp is float:
        return float(value)
    return dict(value) if tp is dict else value


def first_non_finite(value: Any, path: str) -> tuple[str, float] | None:
    """(key path, value) of the first NaN or infinity in ``value`` (a number, or mappings and lists of them), or
    None. YAML reads ``.nan`` / ``.inf`` and JSON ``NaN`` / ``Infinity`` as floats; no size, fraction or config
    value means one, and a NaN passes every range check (``nan <= 0`` is false)."""
    if isinstance(value, float) and not math.isfinite(value):
        return path, value
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, child in children:
        found = first_non_finite(child, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def refuse_non_finite(value: Any, where: str, path: str) -> None:
    """A ConfigError naming the key of the first NaN or infinity in ``value`` (see ``first_non_finite``)."""
    found = first_non_finite(value, path)
    if found is not None:
        raise ConfigError(where, f"{found[0]}: {found[1]!r} is not a finite number",
                          "write a finite number (NaN and infinity mean nothing in a config)")


def to_plain(obj: Any) -> Any:
    """A dataclass tree as plain JSON-able data (tuples become lists): the fields ``build`` takes back (values
    resolved in ``__post_init__`` into ``init=False`` fields, such as ``SaveConfig.axes``, are built again)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


def load_yaml(path) -> Any:
    """Parse a YAML file strictly (UTF-8; no duplicate keys, no alias bombs or recursive aliases); every problem (syntax, an
    unreadable file, a folder, bytes that are not UTF-8) is one ConfigError naming the file, and the line where
    there is one."""
    where = str(path)
    if os.path.isdir(path):
        raise ConfigError(where, "is a directory, not a YAML file", "name a .yaml file inside it, or a shipped name")
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise ConfigError(where, f"cannot be read ({exc.strerror or exc})", "check the path and its permissions") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(where, f"line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
                          "save the file as UTF-8") from None
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where_line = f"line {mark.line + 1}: " if mark is not None else ""
        problem = " ".join(p for p in (exc.context, exc.problem) if p)
        kind = "" if isinstance(exc, Refused) else "not valid YAML: "
        raise ConfigError(where, f"{where_line}{kind}{_short(problem)}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(where, f"not valid YAML: {_short(str(exc))}") from None
    except RecursionError:
        raise ConfigError(where, "nested too deeply to read", "flatten the file (a config file needs a few levels)") from None


def _brief(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: a bad value in an error message is shown, never a megabyte of it."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short(text: str, limit: int = 300) -> str:
    """One line of at most ``limit`` characters: an error never echoes a whole hostile file."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
