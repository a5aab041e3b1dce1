"""What a checkpoint on disk is, in plain lines: ``flashckpt inspect PATH``.

PATH is one checkpoint folder, or a checkpoint root (then its committed checkpoints are listed and the one
``latest`` names is inspected). The manifest check is the same verification every load does (sizes and sha256 of
every listed file, each confined to the folder; the files ``meta.json`` names are listed; DCP metadata is read with the
safe unpickler of ``safe_dcp``); no tensor is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pytest_flashckpt.checkpoint import safe_dcp
from pytest_flashckpt.checkpoint.errors import CheckpointError
from pytest_flashckpt.checkpoint.loading import checked_meta
from pytest_flashckpt.checkpoint.manifest import MANIFEST, read_manifest, verify
from pytest_flashckpt.checkpoint.payload import META
from pytest_flashckpt.checkpoint.roots import root_path
from pytest_flashckpt.checkpoint.store import LATEST, CheckpointStore


@dataclass
class Inspection:
    lines: list[str] = field(default_factory=list)
    verified: bool = False


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} B"


def inspect_checkpoint(path: Path) -> Inspection:
    path = root_path(path)  # an s3:// URL is refused as one, not reported as a missing local folder
    out = Inspection()
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint folder or checkpoint root")
    folder = path
    if not (path / MANIFEST).is_file() and (path / LATEST).is_file():
        store = CheckpointStore(path)
        complete = store.complete()
        out.lines.append(f"root: {path}  ({len(complete)} committed: {', '.join(p.name for p in complete) or 'none'})")
        try:
            latest = store.latest_name()
        except CheckpointError as exc:  # a latest leading out of the root is reported, never followed
            out.lines.append(f"check: FAILED: {exc}")
            return out
        out.lines.append(f"latest -> {latest}")
        folder = path / str(latest)
        if not folder.is_dir():
            out.lines.append(f"check: FAILED: {path / LATEST} names {latest!r}, which does not exist (deleted or moved)")
            return out
    out.lines.append(f"checkpoint: {folder}")
    try:
        manifest = read_manifest(folder)
    except CheckpointError as exc:
        out.lines.append(f"check: FAILED: {exc}")
        inside = folder.resolve()
        files = sorted(p for p in folder.rglob("*") if p.is_file() and p.resolve().is_relative_to(inside))
        out.lines.append("files on disk (no manifest to check them against):")
        out.lines.extend(f"  {p.relative_to(folder).as_posix()}  {_size(p.stat().st_size)}" for p in files)
        return out
    versions = manifest.versions
    out.lines.append(
        f"step: {manifest.step}  strategy: {manifest.strategy}  format: {manifest.format}  base: {manifest.base or '-'}"
    )
    out.lines.append(
        f"written by: pytest_flashckpt {versions.get('pytest_flashckpt', '?')}, torch {versions.get('torch', '?')}"
    )
    out.lines.append(f"files ({len(manifest.files)}, {_size(manifest.bytes)} + {MANIFEST}):")
    width = max((len(rel) for rel in manifest.files), default=0)
    out.lines.extend(f"  {rel.ljust(width)}  {_size(int(info['bytes']))}" for rel, info in sorted(manifest.files.items()))
    try:
        verify(folder)
        if META in manifest.files or (folder / META).exists():
            checked_meta(folder, manifest)  # the files meta.json names: inside the folder and listed
        if manifest.format == "dcp":  # the DCP metadata pickles are read the safe way: refused if crafted
            for meta in sorted(rel for rel in manifest.files if rel.endswith(f"/{safe_dcp.METADATA}") or rel == safe_dcp.METADATA):
                prefix = meta[: -len(safe_dcp.METADATA)]
                safe_dcp.read_metadata(folder / prefix if prefix else folder, manifest.files, prefix)
    except CheckpointError as exc:
        out.lines.append(f"check: CORRUPT: {exc}")
        return out
    out.lines.append(f"check: verified ({len(manifest.files)} files: sizes and sha256 match the manifest)")
    out.verified = True
    return out
