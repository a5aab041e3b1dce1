"""Model cards (``models/<name>.yaml``): the shape of a model of one family, read and validated without torch.

A card names its family (``family: llama``; without the key it is ``gpt``, so the GPT cards written before
families existed keep working) and is validated by that family's card schema: the dataclass its module in
``config/cards/`` names (``CARD``), found by ``pkgutil`` (``card_schemas``), so a family adds its schema module and
no line here. A key of another family is an error saying which family has it. The cards live in the configuration
layer so that preflight (``config.preflight``) can check a suite against its cards before anything is built;
``pytest_flashckpt.models`` builds the module from them (``models.families``).

Code outside a family reads a card through ``ModelCard``, the neutral names every schema gives (``num_blocks``,
``width``, ``max_seq_len``, ...), never a family's own field names.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import fields
from pathlib import Path
from typing import Protocol, runtime_checkable

from pytest_flashckpt.config import cards as _cards_package
from pytest_flashckpt.config.data import resolve
from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.typed import build, load_yaml
from pytest_flashckpt.core.files import shown_path

DEFAULT_FAMILY = "gpt"  # a card without a family key (the cards written before families existed)


@runtime_checkable
class ModelCard(Protocol):
    """What every family's card gives to code outside the family (a frozen dataclass per family)."""

    name: str
    family: str
    vocab_size: int
    dropout: float
    allocate_on_cpu: bool  # false for cards too big to allocate on a CPU (built on the meta device)

    @property
    def num_blocks(self) -> int: ...  # transformer blocks

    @property
    def width(self) -> int: ...  # the residual stream's width

    @property
    def max_seq_len(self) -> int: ...  # the longest sequence the model takes

    @property
    def num_heads(self) -> int: ...  # (query) attention heads per block

    @property
    def mlp_width(self) -> int: ...  # the MLP's hidden width

    def num_params(self) -> int: ...  # computed without building the model


_SCHEMAS: dict[str, type] = {}


def register_card_schema(family: str, schema: type) -> None:
    """``schema`` validates the cards that say ``family: <family>`` (a name taken already is an error)."""
    if family in _SCHEMAS and _SCHEMAS[family] is not schema:
        raise ValueError(f"model family {family!r} has a card schema already ({_SCHEMAS[family].__qualname__})")
    default = {f.name: f.default for f in fields(schema)}.get("family")
    if default != family:
        raise ValueError(f"card schema {schema.__qualname__} of family {family!r} must default 'family' to {family!r}")
    _SCHEMAS[family] = schema


def discover_card_schemas(package: str, path) -> None:
    """Register ``CARD`` of every module of ``package`` (found at ``path``), under the module's name."""
    for info in pkgutil.iter_modules(path):
        register_card_schema(info.name, importlib.import_module(f"{package}.{info.name}").CARD)


def card_schemas() -> dict[str, type]:
    """Every family's card schema, by family name."""
    return dict(_SCHEMAS)


discover_card_schemas(_cards_package.__name__, _cards_package.__path__)


def load_card(name_or_path: str | Path, **overrides) -> ModelCard:
    """Read a model card by shipped name (``tiny``) or path; ``overrides`` replace card fields (validated by the
    card's family: ``family`` absent means ``gpt``)."""
    path = resolve("models", str(name_or_path))
    where = shown_path(path)
    data = load_yaml(path) or {}
    if isinstance(data, dict):
        data = {**data, **overrides}
    family = data.get("family", DEFAULT_FAMILY) if isinstance(data, dict) else DEFAULT_FAMILY
    cls = _SCHEMAS.get(family) if isinstance(family, str) else None
    if cls is None:
        raise ConfigError(where, f"family: {family!r} is not a model family", f"valid: {', '.join(_SCHEMAS)}")
    try:
        return build(cls, data, where=where)
    except ConfigError as exc:
        other = _family_with_key(exc.problem, family)
        if other is None:
            raise
        raise ConfigError(exc.where, exc.problem, f"{exc.fix}; that key belongs to the {other} family: "
                          f"a {other} card says 'family: {other}'") from None


def _family_with_key(problem: str, family: str) -> str | None:
    """For an "unknown key 'n_kv_head'" problem: the other family whose cards have that key, or None."""
    if not problem.startswith("unknown key "):
        return None
    key = problem.removeprefix("unknown key ").strip("'\"")
    for name, cls in _SCHEMAS.items():
        if name != family and key in {f.name for f in fields(cls)}:
            return name
    return None
