"""Confinement: every path a checkpoint names stays inside the checkpoint's own folder.

A checkpoint folder is data anyone who can write the files controls: ``manifest.json`` entries, the file names in
``meta.json``, the base a selective checkpoint names, the ``latest`` pointer of a root and the shard names in DCP's
``.metadata``. Each is a relative name that must resolve (symlinks followed) inside the folder it belongs to; an
absolute path, a ``..`` component or a symlink leading out is refused with a ``CorruptCheckpointError`` naming the
entry, before anything is opened. (The sha256 list in the manifest is no defence: whoever writes a file can re-hash
the manifest too.)
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from pytest_flashckpt.checkpoint.errors import CorruptCheckpointError


def relative_problem(rel: object) -> str | None:
    """Why ``rel`` is not a plain relative path (absolute, ``..``, empty, backslashes, NUL), or None if it is one.
    Used at config time too (``layer_checkpoint_dir``), where the folder does not exist yet."""
    if not isinstance(rel, str) or not rel.strip():
        return "it is not a non-empty string"
    if "\x00" in rel:
        return "it holds a NUL byte"
    if "\\" in rel:
        return "it holds a backslash (use / between folder names)"
    pure = PurePosixPath(rel)
    if pure.is_absolute() or rel.startswith("~"):
        return "it is an absolute path"
    if ".." in pure.parts:
        return "it climbs out with '..'"
    if not pure.parts or pure.parts == (".",):
        return "it names the folder itself, not an entry in it"
    return None


def confined(folder: Path, rel: object, what: str) -> Path:
    """``folder / rel``, checked to stay inside ``folder`` (symlinks resolved); ``what`` names where ``rel`` came
    from in the error (e.g. "manifest entry", "meta.json file")."""
    problem = relative_problem(rel)
    if problem is None:
        path = Path(folder) / str(rel)
        try:
            inside = path.resolve().is_relative_to(Path(folder).resolve())
        except (OSError, RuntimeError) as exc:  # a symlink loop
            inside, problem = False, f"it cannot be resolved ({type(exc).__name__})"
        if not inside and problem is None:
            problem = "it resolves outside the folder (a symlink leads out)"
        if problem is None:
            return path
    raise CorruptCheckpointError(
        f"{folder}: {what} {rel!r} refused: {problem}; a checkpoint may only name files inside its own folder. "
        "Nothing was read from it: delete the checkpoint or resume from an older one"
    )


def plain_name(root: Path, name: object, what: str) -> Path:
    """``root / name`` for a single folder name (``latest``'s target, a selective checkpoint's base): one path
    component, confined to ``root``."""
    if isinstance(name, str) and (len(PurePosixPath(name).parts) != 1 or name in (".", "..") or "/" in name):
        raise CorruptCheckpointError(
            f"{root}: {what} {name!r} refused: it must be the name of a checkpoint folder directly inside {root} "
            "(no '/', no '..'); rewrite it, or delete it and resume from the newest complete checkpoint"
        )
    return confined(root, name, what)
