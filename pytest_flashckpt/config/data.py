"""Where the shipped data (model cards, suites) lives: the source checkout or the installed wheel.

The repository keeps ``models/`` and ``suites/`` at its top level (the design card fixes that layout); the
wheel carries copies under ``pytest_flashckpt/_data/`` so an installed plugin works from any folder.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent
KIND_WORDS = {"models": "model card", "suites": "suite"}  # what errors call one file of each kind


def data_dir(kind: str) -> Path:
    """Folder of shipped ``kind`` files (``"models"`` or ``"suites"``)."""
    installed = _PACKAGE / "_data" / kind
    if installed.is_dir():
        return installed
    checkout = _PACKAGE.parent / kind
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(f"pytest-flashckpt data folder {kind!r} is missing from {installed} and {checkout}")


def shipped_names(kind: str) -> list[str]:
    """Names (file stems) of the shipped YAML files of one kind, sorted."""
    return sorted(p.stem for p in data_dir(kind).glob("*.yaml"))


def names_a_file(name_or_path: str) -> bool:
    """Whether a card or suite value is a path (``cards/my.yaml``, ``my.yml``) rather than a shipped name (``tiny``)."""
    candidate = Path(name_or_path)
    return candidate.suffix in {".yaml", ".yml"} or candidate.parent != Path(".")


def anchored(path: str, folder: Path) -> str:
    """A relative ``path`` written in a file in ``folder``, as a path that names the same file from the current
    folder (shown relative to it when below it, so a suite run from its own folder keeps its strings); an absolute
    or ``~`` path as written."""
    from pytest_flashckpt.core.files import shown_path

    if path.startswith("~") or Path(path).is_absolute():
        return path
    return shown_path((folder / path).absolute())


def resolve(kind: str, name_or_path: str) -> Path:
    """A shipped name (``tiny``) or a path to a YAML file, to an existing path; a clear error otherwise."""
    from pytest_flashckpt.config.errors import ConfigError

    candidate = Path(name_or_path)
    if names_a_file(name_or_path):
        if candidate.is_file():
            return candidate
        raise ConfigError(str(candidate), f"{KIND_WORDS.get(kind, kind[:-1])} file not found", f"shipped {kind}: {', '.join(shipped_names(kind))}")
    shipped = data_dir(kind) / f"{name_or_path}.yaml"
    if shipped.is_file():
        return shipped
    raise ConfigError(
        "", f"unknown {KIND_WORDS.get(kind, kind[:-1])} {name_or_path!r}",
        f"valid names: {', '.join(shipped_names(kind))}, or a path to a .yaml file",
    )
