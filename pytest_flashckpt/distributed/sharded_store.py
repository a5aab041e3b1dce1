"""Sharded checkpoints with ``torch.distributed.checkpoint`` under the single-process commit protocol.

A save (every rank calls it): rank 0 takes the folder's writer lock, reserves the name and creates the temporary
folder ``.tmp-<name>-*`` (``CheckpointStore.begin``) and broadcasts its path; every rank writes its shards with
``dcp.save`` or ``dcp.async_save`` into ``<tmp>/dcp``; once every rank is done (DCP's own finish step, then a
barrier), rank 0 writes ``train_state.json`` (step, data position, LR schedule), ONE ``manifest.json`` for the whole
checkpoint (size and sha256 of every file of every rank), renames the folder and moves ``latest`` last
(``CheckpointStore.commit``). A rank that dies before the commit leaves only a ``.tmp-*`` folder: ``latest`` still
names the previous checkpoint.

A load verifies the manifest on rank 0 before DCP reads anything (and the verdict is broadcast, so every rank stops
on a corrupt checkpoint). DCP's ``.metadata`` file is a pickle; the sha256 check cannot vouch for it (whoever writes
the files can re-hash the manifest), so it is read only by ``checkpoint.safe_dcp``, which unpickles nothing but the
DCP metadata classes (checked on rank 0 with the manifest, then by every rank's reader), and its non-tensor entries
are read with ``torch.load(weights_only=True)``.

The state is ``get_state_dict(model, optimizer)`` (torch's FQN-keyed model and optimizer state, sharded as DTensors
under FSDP2), so a checkpoint saved at N ranks loads at M ranks, or into a plain single-process model. Saves flatten
the optimizer state (``SAVE_OPTIONS``): one key per parameter and setting, so the ranks of pipeline stages, which
hold disjoint parameters (``distributed.pipeline.PipelineTrainer.model``: the stages under the whole model's
names), write one checkpoint that loads into any layout; ``train_state.json`` says so (``optim_layout``), and a
checkpoint without it is read nested, as saves were before.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from pytest_flashckpt.checkpoint import dcp_io, safe_dcp
from pytest_flashckpt.checkpoint.errors import CheckpointError
from pytest_flashckpt.checkpoint.manifest import Manifest, verify, write_manifest
from pytest_flashckpt.checkpoint.roots import check_root
from pytest_flashckpt.checkpoint.scheduling import process_memory
from pytest_flashckpt.checkpoint.space import PER_SAVE_BYTES, PER_TENSOR_BYTES, check_free_space
from pytest_flashckpt.checkpoint.store import CheckpointStore
from pytest_flashckpt.distributed.lock import WriterLock
from pytest_flashckpt.training import Trainer

DCP_DIR = "dcp"
TRAIN_STATE = "train_state.json"
STRATEGY = "fsdp-dcp"
SAVE_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)  # torch's option: state.<fqn>.<key>, param_groups.<fqn>.<key>
FLAT = "flat"  # train_state.json's optim_layout for a save with SAVE_OPTIONS


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _broadcast(value: Any, group=None) -> Any:
    box = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def training_state(trainer: Trainer, options: StateDictOptions | None = None) -> dict[str, Any]:
    """``{"model": ..., "optim": ...}`` as torch's ``get_state_dict`` returns them (sharded under FSDP2)."""
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer, options=options)
    return {"model": model_sd, "optim": optim_sd}


def gathered_state(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The full (unsharded) model and optimizer state on CPU, flattened to ``model/<fqn>`` and
    ``optim/state/<fqn>/<key>`` tensors; complete on rank 0 (a collective: every rank calls it)."""
    state = training_state(trainer, StateDictOptions(full_state_dict=True, cpu_offload=True))
    flat: dict[str, torch.Tensor] = {}
    if _rank() != 0:
        return flat  # cpu_offload keeps the full state on rank 0 only
    for fqn, tensor in state["model"].items():
        flat[f"model/{fqn}"] = tensor
    for fqn, values in state["optim"]["state"].items():
        for key, tensor in values.items():
            flat[f"optim/state/{fqn}/{key}"] = tensor if isinstance(tensor, torch.Tensor) else torch.tensor(tensor)
    for i, group in enumerate(state["optim"]["param_groups"]):
        for key, value in group.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                flat[f"optim/param_groups/{i}/{key}"] = torch.tensor(value, dtype=torch.float64)
    return flat


def bitwise_differences(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Keys whose tensors differ in any bit (or in dtype or shape), plus keys present on one side only."""
    out = sorted(set(a) ^ set(b))
    for key in sorted(set(a) & set(b)):
        x, y = a[key], b[key]
        if x.dtype != y.dtype or x.shape != y.shape:
            out.append(key)
        elif not torch.equal(x.detach().cpu().contiguous().view(-1).view(torch.uint8), y.detach().cpu().contiguous().view(-1).view(torch.uint8)):
            out.append(key)
    return out


def local_bytes(state: Any) -> int:
    """Bytes of this rank's tensors in a (possibly sharded) state dict: local shards of DTensors."""
    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_leaves

    tensors = [t.to_local() if isinstance(t, DTensor) else t for t in tree_leaves(state) if isinstance(t, torch.Tensor)]
    return sum(t.untyped_storage().nbytes() if t.dim() == 0 else t.numel() * t.element_size() for t in tensors)


def _train_state(trainer: Trainer, world_size: int) -> dict[str, Any]:
    sched = trainer.scheduler.state_dict()  # LambdaLR: lr_lambdas is [None] for plain functions, so JSON holds it
    return {"step": trainer.step, "seed": trainer.seed, "world_size": world_size, "scheduler": sched, "optim_layout": FLAT}


def _options(train_state: dict[str, Any]) -> StateDictOptions | None:
    """How the checkpoint's optimizer state was laid out: flattened (``SAVE_OPTIONS``), or nested (saves before)."""
    return SAVE_OPTIONS if train_state.get("optim_layout") == FLAT else None


def local_full_state(trainer: Trainer) -> dict[str, torch.Tensor]:
    """This rank's parameters and optimizer state as full tensors (DTensors gathered over their mesh: a collective
    over the ranks that share them), flattened to ``model/<fqn>`` and ``optim/<key>``. Every rank holds what it
    trains: all of it under FSDP, its stages' part of it under pipeline stages, where ``gathered_state`` (rank 0
    only) would miss the other stages."""
    options = StateDictOptions(full_state_dict=True, flatten_optimizer_state_dict=True)
    state = training_state(trainer, options)
    flat = {f"model/{fqn}": t for fqn, t in state["model"].items()}
    for key, value in state["optim"].items():
        if isinstance(value, torch.Tensor):
            flat[f"optim/{key}"] = value
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[f"optim/{key}"] = torch.tensor(value, dtype=torch.float64)
    return flat


@dataclass
class ShardedSave:
    """One save in flight; ``finish()`` (every rank) waits for the writes and commits. Times are this rank's."""

    trainer_step: int
    name: str
    tmp: Path
    future: Future | None
    started: float
    stall_s: float
    host_bytes_added: int = 0  # async: this process's resident set after staging minus before (allocator reuse can hide some)
    staged_bytes: int = 0  # async: bytes of this rank's tensors DCP copies into host memory before returning
    train_state: dict[str, Any] = field(default_factory=dict)
    total_s: float | None = None
    bytes_written: int = 0  # files this rank wrote
    folder: Path | None = None


class ShardedCheckpointer:
    """Sharded saves into ``root`` (every rank constructs one with the same ``root``); rank 0 owns the commit."""

    def __init__(self, root: Path, *, async_save: bool = False, config: dict[str, Any] | None = None) -> None:
        # The same checks as the single-process checkpointer's, on every rank before any collective: the ranks
        # share the root, so they agree (a file in the way, a single checkpoint passed as the root, ...).
        self.root = check_root(root, writing=True)
        self.async_save = async_save
        self.config = dict(config or {})
        self.rank = _rank()
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        # DCP's collectives (plan exchange, finish) run on their own gloo group, so an async save's background
        # thread never interleaves with FSDP's collectives on the default group.
        self.group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self.store = CheckpointStore(self.root) if self.rank == 0 else None
        self.lock = WriterLock(self.root)
        self.pending: ShardedSave | None = None
        self.saves: list[ShardedSave] = []

    def __enter__(self) -> "ShardedCheckpointer":
        error = None
        if self.rank == 0:
            try:
                self.lock.acquire()
            except CheckpointError as exc:
                error = str(exc)
        error = _broadcast(error, self.group) if self.group is not None else error
        if error:
            raise CheckpointError(error)
        return self

    def __exit__(self, *exc) -> None:
        try:
            if exc[0] is None:
                self.wait()
        finally:
            self.lock.release()

    def save(self, trainer: Trainer) -> ShardedSave:
        """Start a save (sync: returns once committed; async: once DCP has staged the state in host memory)."""
        started = time.perf_counter()
        self.wait()  # at most one save in flight, as torch's async_save expects
        state = training_state(trainer, SAVE_OPTIONS)
        where: tuple[str, str] | str | None = None
        needed = self._bytes_needed(state)
        refusal: CheckpointError | None = None
        if self.rank == 0:
            try:
                check_free_space(self.root, needed, f"sharded save of step {trainer.step} into {self.root}")
                name = self.store.reserve_name(trainer.step)
                where = (name, str(self.store.begin(name)))
            except CheckpointError as exc:  # every rank must learn it before anything is written
                refusal, where = exc, str(exc)
        where = _broadcast(where, self.group) if self.group is not None else where
        if refusal is not None:
            raise refusal
        if isinstance(where, str):
            raise CheckpointError(where)
        name, tmp = where
        tmp = Path(tmp)
        rss_before = process_memory()[0]
        if self.async_save:
            future = dcp.async_save(state, checkpoint_id=str(tmp / DCP_DIR), process_group=self.group)
        else:
            dcp.save(state, checkpoint_id=str(tmp / DCP_DIR), process_group=self.group)
            future = None
        record = ShardedSave(trainer.step, name, tmp, future, started, 0.0, train_state=_train_state(trainer, self.world_size))
        if self.async_save:
            record.host_bytes_added = max(0, process_memory()[0] - rss_before)
            record.staged_bytes = local_bytes(state)
            record.stall_s = time.perf_counter() - started
            self.pending = record
        else:
            self._finish(record)
            record.stall_s = time.perf_counter() - started
        self.saves.append(record)
        return record

    def _bytes_needed(self, state: Any) -> int:
        """An upper bound of what one save writes over all ranks (they share the root's filesystem): every rank's
        local tensor bytes summed (a collective), plus the formats' per-item and per-save overheads
        (``checkpoint.space``). Every leaf is one DCP item: a tensor, or a setting pickled on its own (the flattened
        optimizer's ``param_groups.<fqn>.lr`` and the like)."""
        from torch.utils._pytree import tree_leaves

        counts = torch.tensor([local_bytes(state) + PER_TENSOR_BYTES * len(tree_leaves(state))], dtype=torch.int64)
        if self.group is not None:
            dist.all_reduce(counts, group=self.group)
        return int(counts.item()) + PER_SAVE_BYTES

    def wait(self) -> None:
        """Finish (and commit) the save in flight, if any."""
        if self.pending is not None:
            record, self.pending = self.pending, None
            self._finish(record)

    def _finish(self, record: ShardedSave) -> None:
        if record.future is not None:
            record.future.result()
        record.bytes_written = sum(p.stat().st_size for p in (record.tmp / DCP_DIR).glob(f"__{self.rank}_*"))
        if self.group is not None:
            dist.barrier(group=self.group)
        error = None
        if self.rank == 0:
            try:
                (record.tmp / TRAIN_STATE).write_text(json.dumps(record.train_state, indent=1, sort_keys=True), encoding="utf-8")
                record.bytes_written += (record.tmp / DCP_DIR / ".metadata").stat().st_size
                manifest = Manifest(record.name, record.trainer_step, STRATEGY, "dcp", {**self.config, "world_size": self.world_size})
                write_manifest(record.tmp, manifest)
                record.folder = self.store.commit(record.tmp, record.name)
            except Exception as exc:  # every rank must learn that the commit failed
                error = f"{type(exc).__name__}: {exc}"
                self.store.abort(record.tmp)
        if self.group is not None:
            error = _broadcast(error, self.group)
        if error:
            raise CheckpointError(f"sharded save {record.name} into {self.root} failed on rank 0: {error}")
        record.folder = self.root / record.name
        record.total_s = time.perf_counter() - record.started


def _verified(folder: Path, group=None) -> dict[str, Any]:
    """Rank 0 checks the manifest (every file's size and sha256) and reads the train state; all ranks get the verdict."""
    answer: tuple[str | None, dict | None] = (None, None)
    if _rank() == 0:
        try:
            manifest = verify(folder)
            if manifest.format != "dcp" or manifest.strategy != STRATEGY:
                raise CheckpointError(f"{folder}: a {manifest.strategy}/{manifest.format} checkpoint, not a sharded DCP one; load it with pytest_flashckpt.checkpoint.load_into")
            for rel in (TRAIN_STATE, f"{DCP_DIR}/{safe_dcp.METADATA}"):
                if rel not in manifest.files:
                    raise CheckpointError(f"{folder}: {rel} is not listed in its manifest, so never verified; delete the checkpoint or resume from an older one")
            safe_dcp.read_metadata(folder / DCP_DIR, manifest.files, f"{DCP_DIR}/")
            answer = (None, json.loads((folder / TRAIN_STATE).read_text(encoding="utf-8")))
        except (CheckpointError, OSError, ValueError) as exc:
            answer = (str(exc), None)
    if dist.is_initialized() and dist.get_world_size() > 1:
        answer = _broadcast(answer, group)
    if answer[0]:
        raise CheckpointError(answer[0])
    return answer[1]


def _restore(trainer: Trainer, folder: Path, group=None) -> dict[str, Any]:
    train_state = _verified(folder, group)
    options = _options(train_state)
    state = training_state(trainer, options)
    try:
        safe_dcp.load(state, folder / DCP_DIR, process_group=group)
        set_state_dict(trainer.model, trainer.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=options)
        trainer.scheduler.load_state_dict(train_state["scheduler"])
        trainer.step = int(train_state["step"])
    except CheckpointError:
        raise
    except Exception as exc:  # DCP wraps a rank's failure in CheckpointException; a malformed train_state.json
        raise CheckpointError(f"{folder}: could not be restored ({type(exc).__name__}: {str(exc)[:300]}); delete the checkpoint or resume from an older one") from None
    return train_state


def load(trainer: Trainer, folder: Path, group=None) -> dict[str, Any]:
    """Restore a sharded checkpoint into ``trainer`` at this world size (any: DCP reshards on read). Every rank calls it."""
    return _restore(trainer, Path(folder), group)


def load_plain(trainer: Trainer, folder: Path) -> dict[str, Any]:
    """Restore a sharded checkpoint into a plain single-process (non-FSDP) trainer: DCP reads every shard into the
    full tensors. Runs without torchrun: a one-rank in-memory group stands in when none exists (``dcp.load`` with
    ``no_dist=True`` would warn on every call)."""
    with dcp_io.process_group():
        return _restore(trainer, Path(folder))


def latest(root: Path) -> Path | None:
    """The folder ``root/latest`` names (committed, so it has a manifest), or None."""
    name = CheckpointStore(Path(root)).latest_name()
    return Path(root) / name if name else None
