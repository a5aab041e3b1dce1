"""What a checkpoint holds: the full training state of a ``Trainer`` as flat tensors plus a JSON tree.

Captured: model weights (a tied tensor once, with its aliases recorded, because safetensors refuses shared storage),
optimizer and (when there is one) LR-scheduler state, the step (for a ``Trainer`` also the data position: batches are
a function of (seed, position)), every RNG stream (torch CPU, CUDA when initialised, python ``random``, numpy), and
any extra state a training loop names (``extra``: objects with ``state_dict()`` / ``load_state_dict()``, the
``Stateful`` protocol of ``torch.distributed.checkpoint``: a data loader's position, a sampler, a counter). Tensors
are *references* to the live state: a synchronous save writes them while training waits; an asynchronous save copies
them into its staging area first (an extra's ``state_dict()`` is called at the save call).

What is saved is anything shaped like a ``Trainer`` (:class:`Checkpointable`): the public API
(``checkpoint.api``) hands in a user's own model, optimizer, scheduler and extras this way, no wrapper around them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

import numpy as np
import torch

from pytest_flashckpt.checkpoint.errors import CheckpointError
from pytest_flashckpt.checkpoint.treeflat import flatten, unflatten
from pytest_flashckpt.training import Trainer


class Stateful(Protocol):
    """What an extra state object provides (the protocol ``torch.distributed.checkpoint`` uses)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class Checkpointable(Protocol):
    """What a save captures and a restore fills: a ``Trainer``, or ``checkpoint.api``'s view of a user's loop.
    ``scheduler`` may be None; ``extra`` (optional attribute) maps names to :class:`Stateful` objects."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    step: int

    def state_tensors(self) -> list[torch.Tensor]: ...


def check_stateful(extra: Mapping[str, Any], where: str = "extra") -> dict[str, Any]:
    """``extra`` as a dict, each value checked to have ``state_dict`` and ``load_state_dict`` (a ValueError naming the
    key otherwise, before anything is saved)."""
    out: dict[str, Any] = {}
    for name, obj in dict(extra or {}).items():
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"{where}: key {name!r} must be a non-empty string without '/'")
        if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
            raise ValueError(
                f"{where}[{name!r}]: a {type(obj).__name__} has no state_dict() / load_state_dict(); extra state follows "
                "the Stateful protocol of torch.distributed.checkpoint (give the object both methods)"
            )
        out[name] = obj
    return out


@dataclass
class CapturedState:
    """``tensors`` by key, the JSON ``tree`` that references them, and for each tensor key the model parameter it
    belongs to (``owners``; model weights and their optimizer state; None for RNG and other global tensors)."""

    tensors: dict[str, torch.Tensor]
    tree: dict[str, Any]
    owners: dict[str, str | None] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    @property
    def on_device(self) -> bool:
        """True when any tensor lives on a GPU (its snapshot then goes to pinned host memory, not device memory)."""
        return any(t.device.type == "cuda" for t in self.tensors.values())


def _storage_key(t: torch.Tensor) -> tuple:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def capture(trainer: Trainer | Checkpointable) -> CapturedState:
    """The trainer's full state, by reference (no copies)."""
    model_sd = trainer.model.state_dict()
    first_name: dict[tuple, str] = {}
    aliases: dict[str, str] = {}
    unique: dict[str, torch.Tensor] = {}
    for name, t in model_sd.items():
        key = _storage_key(t)
        if key in first_name:
            aliases[name] = first_name[key]
        else:
            first_name[key] = name
            unique[name] = t.detach()
    tensors: dict[str, torch.Tensor] = {}
    owners: dict[str, str | None] = {}
    tree: dict[str, Any] = {"model": {}, "model_aliases": aliases}
    for name, t in unique.items():
        tensors[f"model/{name}"] = t
        owners[f"model/{name}"] = name
        tree["model"][name] = {"__tensor__": f"model/{name}"}
    index_names = param_index_names(trainer)
    opt_tensors: dict[str, torch.Tensor] = {}
    tree["optimizer"] = flatten(trainer.optimizer.state_dict(), "optimizer", opt_tensors)
    for key, t in opt_tensors.items():
        tensors[key] = t
        parts = key.split("/")
        owners[key] = index_names.get(int(parts[2])) if len(parts) > 3 and parts[1] == "state" and parts[2].isdigit() else None
    rest: dict[str, torch.Tensor] = {}
    scheduler = getattr(trainer, "scheduler", None)
    tree["scheduler"] = None if scheduler is None else flatten(scheduler.state_dict(), "scheduler", rest)
    tree["rng"] = flatten(_rng_state(), "rng", rest)
    extra = check_stateful(getattr(trainer, "extra", None) or {})
    if extra:
        tree["extra"] = {name: flatten(obj.state_dict(), f"extra/{name}", rest) for name, obj in extra.items()}
    for key, t in rest.items():
        tensors[key] = t
        owners[key] = None
    tree["step"] = trainer.step
    tree["data_position"] = trainer.step
    tree["seed"] = getattr(trainer, "seed", None)
    return CapturedState(tensors, tree, owners)


def param_index_names(trainer: Trainer | Checkpointable) -> dict[int, str]:
    """Optimizer parameter index (as in ``optimizer.state_dict()``) -> model parameter name."""
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    out: dict[int, str] = {}
    index = 0
    for group in trainer.optimizer.param_groups:
        for p in group["params"]:
            out[index] = names.get(id(p), f"<unnamed {index}>")
            index += 1
    return out


def restore(trainer: Trainer | Checkpointable, tensors: dict[str, torch.Tensor], tree: dict[str, Any], source: str) -> None:
    """Put a captured state back into ``trainer`` (model, optimizer, scheduler, extra state, step, RNG); ``source``
    names the checkpoint in errors. A scheduler or extra state saved but not given (or given but not saved) is an
    error naming it before anything is loaded."""
    try:
        state = unflatten(tree, tensors)
    except KeyError as exc:
        raise CheckpointError(f"{source}: the metadata names tensor {exc} which no file of the checkpoint holds") from None
    scheduler = getattr(trainer, "scheduler", None)
    if (state.get("scheduler") is None) != (scheduler is None):
        saved = "no scheduler" if state.get("scheduler") is None else "a scheduler's state"
        given = "none was given" if scheduler is None else f"a {type(scheduler).__name__} was given"
        raise CheckpointError(f"{source}: the checkpoint holds {saved} but {given}; resume with the same scheduler setup it was saved with")
    extra = check_stateful(getattr(trainer, "extra", None) or {})
    saved_extra = state.get("extra") or {}
    if set(saved_extra) != set(extra):
        raise CheckpointError(
            f"{source}: the checkpoint holds extra state {sorted(saved_extra)} but {sorted(extra)} was given; "
            "resume with the same extra keys it was saved with"
        )
    model_sd = dict(state["model"])
    for alias, target in state["model_aliases"].items():
        model_sd[alias] = model_sd[target]
    try:
        trainer.model.load_state_dict(model_sd, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{source}: the checkpoint does not fit this model ({exc}); build the model from the same card") from None
    try:
        trainer.optimizer.load_state_dict(state["optimizer"])
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"{source}: the optimizer state does not fit this optimizer ({exc})") from None
    if scheduler is not None:
        scheduler.load_state_dict(state["scheduler"])
    for name, obj in extra.items():
        obj.load_state_dict(saved_extra[name])
    _set_rng_state(state["rng"])
    trainer.step = int(state["step"])


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(legacy=True),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
