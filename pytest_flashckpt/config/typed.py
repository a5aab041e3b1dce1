"""Build typed dataclasses from plain mappings (YAML), with errors that name the key path and valid choices.

One mechanism for every config object (model cards, scenarios, strategy configs): field types come from the
dataclass annotations (``int``, ``float``, ``bool``, ``str``, ``Literal[...]``, ``X | None``, ``list[X]``,
``tuple[X, ...]`` and nested dataclasses); value checks live in each dataclass's ``__post_init__`` and raise
``ValueError``, which is re-raised here as a ``ConfigError`` carrying the file and key path.
Aliases (the article's key names) are declared per dataclass in a ``ALIASES`` class attribute mapping an
accepted key to ``(field, converter)``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

from pytest_flashckpt.config.errors import ConfigError

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
            raise ConfigError(where, f"{path}: {value!r} is not a valid choice", f"valid: {', '.join(map(str, choices))}")
        return value
    if origin in (typing.Union, types.UnionType):
        options = get_args(tp)
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
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(where, f"{path}: expected a list, got {type(value).__name__} {value!r}")
        (item_tp, *_) = get_args(tp) or (Any,)
        items = [coerce(item_tp, v, where, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        return build(tp, value, where, path)
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(where, f"{path}: expected a number, got {type(value).__name__} {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(where, f"{path}: expected an integer, got {type(value).__name__} {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(where, f"{path}: expected true or false, got {type(value).__name__} {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(where, f"{path}: expected a string, got {type(value).__name__} {value!r}")
        return value
    if tp is dict or get_origin(tp) is dict:
        if not isinstance(value, dict):
            raise ConfigError(where, f"{path}: expected a mapping, got {type(value).__name__} {value!r}")
        return dict(value)
    raise TypeError(f"unsupported config annotation {tp!r} at {path}")


def to_plain(obj: Any) -> Any:
    """A dataclass tree as plain JSON-able data (tuples become lists)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


def load_yaml(path) -> Any:
    """Parse a YAML file; a syntax error becomes a ConfigError naming the file and line."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.safe_load(fh)
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), f"not valid YAML: {exc}") from None
