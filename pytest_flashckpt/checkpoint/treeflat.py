"""Nested training state <-> (JSON tree, flat tensor dict).

Both file formats (torch zip and safetensors) and DCP store only a flat ``{key: tensor}`` mapping; everything that is
not a tensor (step counters, hyper-parameters, python's RNG state) goes into the JSON metadata file. Tuples, dicts
with non-string keys (the optimizer's integer parameter ids) and numpy arrays are tagged so that the round trip is
exact and no pickling is ever needed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pytest_flashckpt.checkpoint.errors import CheckpointError

_TAGS = ("__tensor__", "__ndarray__", "__tuple__", "__dict__")


def flatten(obj: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    """Return the JSON tree of ``obj``; tensors found on the way are put in ``tensors`` under their path."""
    if isinstance(obj, torch.Tensor):
        tensors[path] = obj
        return {"__tensor__": path}
    if isinstance(obj, np.ndarray):
        tensors[path] = torch.from_numpy(obj.astype(np.int64) if obj.dtype.kind in "ui" else obj.copy())
        return {"__ndarray__": path, "dtype": str(obj.dtype)}
    if isinstance(obj, tuple):
        return {"__tuple__": [flatten(v, f"{path}/{i}", tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [flatten(v, f"{path}/{i}", tensors) for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and k not in _TAGS for k in obj):
            return {k: flatten(v, f"{path}/{k}", tensors) for k, v in obj.items()}
        return {"__dict__": [[flatten(k, f"{path}/key{i}", tensors), flatten(v, f"{path}/{k}", tensors)] for i, (k, v) in enumerate(obj.items())]}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    raise CheckpointError(f"cannot save a {type(obj).__name__} at {path!r}: only tensors, numbers, strings and containers are saved")


def unflatten(tree: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of :func:`flatten`; a tensor key the tree names but ``tensors`` lacks is a ``KeyError``."""
    if isinstance(tree, list):
        return [unflatten(v, tensors) for v in tree]
    if isinstance(tree, dict):
        if "__tensor__" in tree:
            return tensors[tree["__tensor__"]]
        if "__ndarray__" in tree:
            return tensors[tree["__ndarray__"]].numpy().astype(tree["dtype"])
        if "__tuple__" in tree:
            return tuple(unflatten(v, tensors) for v in tree["__tuple__"])
        if "__dict__" in tree:
            return {unflatten(k, tensors): unflatten(v, tensors) for k, v in tree["__dict__"]}
        return {k: unflatten(v, tensors) for k, v in tree.items()}
    return tree


def tensor_keys(tree: Any) -> list[str]:
    """Every tensor key the tree refers to, in order."""
    out: list[str] = []
    if isinstance(tree, list):
        for v in tree:
            out.extend(tensor_keys(v))
    elif isinstance(tree, dict):
        if "__tensor__" in tree:
            out.append(tree["__tensor__"])
        elif "__ndarray__" in tree:
            out.append(tree["__ndarray__"])
        else:
            for v in tree.values():
                out.extend(tensor_keys(v))
    return out
