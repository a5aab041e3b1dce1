"""Reading torch.distributed.checkpoint folders without running code from them.

DCP's ``.metadata`` is a pickle, and torch's ``FileSystemReader.read_metadata`` unpickles it with plain
``pickle.load``: a crafted file runs whatever its ``__reduce__`` names (``os.system``, ...) the moment a checkpoint is
loaded, inspected or exported, and can then hand back the real metadata so the load "succeeds". A second door is
DCP's default load planner, which reads every non-tensor entry (an optimizer's ``lr``, ``betas``) with
``torch.load(weights_only=False)``.

Here both are closed:

- ``.metadata`` is unpickled by :class:`MetadataUnpickler`, whose ``find_class`` admits only the globals that a
  ``.metadata`` written by torch 2.13 references (found by writing one with every save path of this project --
  single-process ``dcp``, async, per-block, sharded sync and async -- and listing what the pickle names): the DCP
  metadata dataclasses, ``torch.Size``, torch dtypes, the layout and memory-format decoders, and ``pathlib.PosixPath``
  (the ``checkpoint_id`` in ``StorageMeta``). Anything else is refused before it is looked up, naming the file and
  the global; the unpickled object is then checked for shape (types of every entry, shard files confined to the
  folder, no storage transforms).
- :class:`SafeLoadPlanner` reads non-tensor entries with ``torch.load(weights_only=True)``.

:func:`load` is ``dcp.load`` with both plugged in (``storage_reader=`` and ``planner=``); every DCP read in the
project goes through it. A newer torch that writes a global not listed here is refused too (the message says so):
add it to ``ALLOWED`` after checking it is plain data.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any, Iterable

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from pytest_flashckpt.checkpoint.errors import CorruptCheckpointError
from pytest_flashckpt.checkpoint.paths import confined

METADATA = ".metadata"
_DCP_META = "torch.distributed.checkpoint.metadata"
ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {
        (_DCP_META, "Metadata"),
        (_DCP_META, "TensorStorageMetadata"),
        (_DCP_META, "BytesStorageMetadata"),
        (_DCP_META, "ChunkStorageMetadata"),
        (_DCP_META, "TensorProperties"),
        (_DCP_META, "MetadataIndex"),
        (_DCP_META, "StorageMeta"),
        (_DCP_META, "_MEM_FORMAT_ENCODING"),  # an Enum: called with its int value
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),  # looks a torch.layout up by its name
        ("torch", "Size"),
        ("pathlib", "PosixPath"),
    }
)


def _is_dtype(module: str, name: str) -> bool:
    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)


class UnsafeCheckpointError(CorruptCheckpointError):
    """A checkpoint file asked to run or import something that is not checkpoint data; nothing of it was run."""


class MetadataUnpickler(pickle._Unpickler):
    """Unpickles DCP metadata, resolving only the globals in ``ALLOWED`` (and torch dtypes).

    Python's own (pure-Python) unpickler, so that one more opcode can be refused: ``BUILD`` on a class, with which a
    file could set attributes of the allowed classes themselves for the whole process (instances are fine: that is
    how dataclasses are restored). A metadata file is small; reading one costs about a millisecond."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file: io.BufferedIOBase, path: Path) -> None:
        super().__init__(file)
        self.path = path

    def load_build(self) -> None:
        if len(self.stack) >= 2 and isinstance(self.stack[-2], type):
            raise UnsafeCheckpointError(
                f"{self.path}: refused: this DCP metadata pickle sets attributes of the class {self.stack[-2].__name__} "
                "itself (torch never writes that); nothing in it was run. Delete the checkpoint or resume from an older one"
            )
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED or _is_dtype(module, name):
            return super().find_class(module, name)
        raise UnsafeCheckpointError(
            f"{self.path}: refused: this DCP metadata pickle asks for {module}.{name}, which is not one of the "
            "torch.distributed.checkpoint metadata classes (a crafted file would run code this way); nothing in it "
            "was run. Delete the checkpoint or resume from an older one (a newer torch that writes new metadata "
            "classes needs them added to pytest_flashckpt.checkpoint.safe_dcp.ALLOWED)"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeCheckpointError(f"{self.path}: refused: DCP metadata holds no persistent ids; nothing in it was run")


def _check(ok: bool, path: Path, what: str) -> None:
    if not ok:
        raise CorruptCheckpointError(f"{path}: not DCP metadata as torch writes it ({what}); delete the checkpoint or resume from an older one")


def _check_shape(md: Any, path: Path, folder: Path, listed: Iterable[str] | None, prefix: str) -> None:
    _check(isinstance(md, Metadata), path, f"the pickle holds a {type(md).__name__}, not a Metadata")
    _check(isinstance(md.state_dict_metadata, dict), path, "state_dict_metadata is not a dict")
    for key, entry in md.state_dict_metadata.items():
        _check(isinstance(key, str), path, f"key {key!r} is not a string")
        if isinstance(entry, TensorStorageMetadata):
            _check(isinstance(entry.properties, TensorProperties) and isinstance(entry.size, torch.Size), path, f"{key}: bad tensor properties")
            _check(all(isinstance(c, ChunkStorageMetadata) for c in entry.chunks), path, f"{key}: bad chunk list")
        else:
            _check(isinstance(entry, BytesStorageMetadata), path, f"{key}: a {type(entry).__name__} entry")
    _check(isinstance(md.storage_data, dict), path, "storage_data is not a dict")
    shard_files = set()
    for index, info in md.storage_data.items():
        _check(isinstance(index, MetadataIndex) and isinstance(info, _StorageInfo), path, "bad storage_data entry")
        _check(type(info.offset) is int and type(info.length) is int and info.offset >= 0 and info.length >= 0, path, f"{index.fqn}: bad offset or length")
        _check(not info.transform_descriptors, path, f"{index.fqn}: storage transforms {info.transform_descriptors!r} are not used by this project")
        shard_files.add(info.relative_path if isinstance(info.relative_path, str) else repr(info.relative_path))
    wanted = None if listed is None else set(listed)
    for rel in sorted(shard_files):  # a handful of files behind hundreds of entries: each checked once
        confined(folder, rel, f"DCP shard file (in {path.name})")
        if wanted is not None and f"{prefix}{rel}" not in wanted:
            raise CorruptCheckpointError(
                f"{path}: names the shard file {rel!r}, which the checkpoint's manifest does not list "
                "(so it was never verified); delete the checkpoint or resume from an older one"
            )
    _check(md.storage_meta is None or isinstance(md.storage_meta, StorageMeta), path, "bad storage_meta")


def read_metadata(folder: Path, listed: Iterable[str] | None = None, prefix: str = "") -> Metadata:
    """The checked ``Metadata`` of the DCP folder ``folder``. ``listed``: the manifest's file names (relative to the
    checkpoint folder, with ``prefix`` = this DCP folder's path inside it), which every shard file must be among."""
    folder = Path(folder)
    path = confined(folder, METADATA, "DCP metadata")
    try:
        with open(path, "rb") as fh:
            md = MetadataUnpickler(fh, path).load()
    except CorruptCheckpointError:
        raise
    except OSError as exc:
        raise CorruptCheckpointError(f"{path}: cannot be read ({exc.strerror or exc}); the DCP checkpoint is incomplete") from None
    except Exception as exc:  # truncated or garbled pickle: assorted types
        raise CorruptCheckpointError(f"{path}: not a readable DCP metadata file ({type(exc).__name__}: {str(exc)[:200]})") from None
    try:
        _check_shape(md, path, folder, listed, prefix)
    except (AttributeError, TypeError) as exc:  # allowed classes built with missing or odd fields
        raise CorruptCheckpointError(f"{path}: not DCP metadata as torch writes it ({type(exc).__name__}: {str(exc)[:200]}); delete the checkpoint or resume from an older one") from None
    return md


class SafeFileSystemReader(FileSystemReader):
    """torch's ``FileSystemReader`` with :func:`read_metadata` in place of ``pickle.load`` (no rank-local
    metadata: this project never writes it, so a planted ``__<rank>.metadata`` is not a fallback)."""

    def __init__(self, path: str | Path, metadata: Metadata | None = None) -> None:
        super().__init__(path)
        self._checked = metadata  # already read and checked by the caller: DCP gets that very object (read once)

    def reset(self, checkpoint_id: Any = None) -> None:
        super().reset(checkpoint_id)
        if checkpoint_id:
            self._checked = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise CorruptCheckpointError(f"{self.path}: rank-local DCP metadata is not read (this project writes one {METADATA})")
        md = self._checked if self._checked is not None else read_metadata(Path(self.path))
        if md.storage_meta is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner, but non-tensor entries are read with ``torch.load(weights_only=True)``."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except Exception as exc:  # the weights_only unpickler raises assorted types
            raise CorruptCheckpointError(
                f"entry {read_item.dest_index.fqn!r}: refused by torch.load(weights_only=True) ({type(exc).__name__}); "
                "non-tensor DCP entries may hold only plain data"
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def _failure(exc: BaseException) -> BaseException:
    """The first rank's own exception inside DCP's ``CheckpointException`` (which derives from BaseException and
    prints a traceback per rank as its message), else ``exc``."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        if isinstance(inner, tuple) and inner and isinstance(inner[0], BaseException):
            return inner[0]
    return exc


def load(
    state: dict[str, Any], folder: Path, process_group: Any = None, listed: Iterable[str] | None = None, prefix: str = "",
    metadata: Metadata | None = None,
) -> None:
    """``dcp.load(state)`` from ``folder``: its metadata read and checked first (clear error, nothing run; or
    ``metadata``, as :func:`read_metadata` returned it) and handed to DCP through :class:`SafeFileSystemReader`,
    non-tensor entries read through :class:`SafeLoadPlanner`. Any failure is one ``CorruptCheckpointError`` naming
    the folder (a rank's own error, not DCP's traceback dump)."""
    folder = Path(folder)
    md = metadata if metadata is not None else read_metadata(folder, listed, prefix)
    try:
        dcp.load(state, storage_reader=SafeFileSystemReader(str(folder), md), planner=SafeLoadPlanner(), process_group=process_group)
    except (Exception, CheckpointException) as exc:
        inner = _failure(exc)
        if isinstance(inner, CorruptCheckpointError):  # ours: the reader's or the planner's refusal
            raise CorruptCheckpointError(str(inner) if str(folder) in str(inner) else f"{folder}: {inner}") from None
        detail = str(inner).strip().splitlines()[-1][:300] if str(inner).strip() else ""
        raise CorruptCheckpointError(
            f"{folder}: torch.distributed.checkpoint could not read it ({type(inner).__name__}: {detail}); delete the "
            "checkpoint or resume from an older one"
        ) from None
