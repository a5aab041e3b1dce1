"""What a checkpoint holds: the full training state of a ``Trainer`` as flat tensors plus a JSON tree.

Captured: model weights (a tied tensor once, with its aliases recorded, because safetensors refuses shared storage),
optimizer and LR-scheduler state, the step (which is also the data position: batches are a function of
(seed, position)), and every RNG stream (torch CPU, CUDA when initialised, python ``random``, numpy). Tensors are
*references* to the live state: a synchronous save writes them while training waits; an asynchronous save copies
them into its staging area first.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pytest_flashckpt.checkpoint.errors import CheckpointError
from pytest_flashckpt.checkpoint.treeflat import flatten, unflatten
from pytest_flashckpt.training import Trainer


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


def capture(trainer: Trainer) -> CapturedState:
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
    tree["scheduler"] = flatten(trainer.scheduler.state_dict(), "scheduler", rest)
    tree["rng"] = flatten(_rng_state(), "rng", rest)
    for key, t in rest.items():
        tensors[key] = t
        owners[key] = None
    tree["step"] = trainer.step
    tree["data_position"] = trainer.step
    tree["seed"] = trainer.seed
    return CapturedState(tensors, tree, owners)


def param_index_names(trainer: Trainer) -> dict[int, str]:
    """Optimizer parameter index (as in ``optimizer.state_dict()``) -> model parameter name."""
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    out: dict[int, str] = {}
    index = 0
    for group in trainer.optimizer.param_groups:
        for p in group["params"]:
            out[index] = names.get(id(p), f"<unnamed {index}>")
            index += 1
    return out


def restore(trainer: Trainer, tensors: dict[str, torch.Tensor], tree: dict[str, Any], source: str) -> None:
    """Put a captured state back into ``trainer`` (model, optimizer, scheduler, step, RNG); ``source`` names the
    checkpoint in errors."""
    try:
        state = unflatten(tree, tensors)
    except KeyError as exc:
        raise CheckpointError(f"{source}: the metadata names tensor {exc} which no file of the checkpoint holds") from None
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
    trainer.scheduler.load_state_dict(state["scheduler"])
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
