"""A Hugging Face causal LM from its config: ``AutoConfig.for_model`` + ``AutoModelForCausalLM.from_config``,
random init from a seed, the scenario's attention kernel, and never a download.

Offline by construction: the config comes from a mapping or a local ``config.json`` read here (no
``from_pretrained``, no hub id), and ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` are set before transformers is
imported, so a stray hub call fails instead of fetching.

The training step calls ``model(tokens, targets)`` and expects the loss (the project's GPT does that);
``loss_forward`` gives a Hugging Face model that call on the instance: with ``targets`` it returns the next-token
cross-entropy of the logits (the targets are already shifted, ``training.make_batch``), in float32 as transformers'
own loss does; without, it is the model's own forward. Parameter names, ``state_dict`` and the class stay the
model's own (no wrapper module), so checkpoints and exports load into a plain transformers model.
"""

from __future__ import annotations

import json
import os
import types
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from pytest_flashckpt.models.hf.anatomy import discover_anatomy, explain_anatomy, stated_anatomy

ATTN_IMPLEMENTATION = {"sdpa": "sdpa", "eager": "eager", "flash_attn": "flash_attention_2"}
MIN_TRANSFORMERS = "4.45"
DROPOUT_KEYS = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout", "hidden_dropout", "dropout")
POSITION_KEYS = ("n_positions", "max_position_embeddings")


class HFUnavailable(ImportError):
    """transformers is not installed (the optional extra ``pytest-flashckpt[hf]``)."""


def _transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import transformers
    except ImportError:
        raise HFUnavailable(
            "Hugging Face models need transformers: pip install 'pytest-flashckpt[hf]' (transformers>=4.45)"
        ) from None
    return transformers


def _read_config(spec: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    if isinstance(spec, (str, Path)):
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"model.hf: {path} is not a file; give a config.json path or the config's keys inline")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"model.hf: {path} is not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ValueError(f"model.hf: {path} must hold a JSON object (a transformers config.json)")
        return data
    if not isinstance(spec, Mapping):
        raise ValueError(f"model.hf must be a mapping of config keys or a config.json path, got {type(spec).__name__}")
    return dict(spec)


def hf_config(spec: Mapping[str, Any] | str | Path, dropout: float | None = None):
    """The transformers config for ``spec`` (keys incl. ``model_type``, or a config.json path); ``dropout``
    overrides every dropout probability the config has. Unknown model types are a ValueError naming them."""
    transformers = _transformers()
    data = _read_config(spec)
    model_type = data.pop("model_type", None)
    if not isinstance(model_type, str):
        raise ValueError("model.hf: 'model_type' is required (gpt2, llama, ...), as in a transformers config.json")
    for key in ("architectures", "transformers_version", "_name_or_path", "torch_dtype", "dtype"):
        data.pop(key, None)
    try:
        defaults = transformers.AutoConfig.for_model(model_type)
        vocab = data.get("vocab_size", getattr(defaults, "vocab_size", None))
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):  # a tiny vocabulary: GPT-2's 50256 is out of range
            value = getattr(defaults, key, None)
            if key not in data and isinstance(value, int) and isinstance(vocab, int) and value >= vocab:
                data[key] = None
        config = transformers.AutoConfig.for_model(model_type, **data)
    except ValueError as exc:
        raise ValueError(f"model.hf: model_type {model_type!r}: {exc}") from None
    # training, not generation: no KV cache. With one, a checkpointed layer's recomputation would append its keys
    # and values to the cache the first forward filled (transformers turns it off under its own checkpointing too)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    if dropout is not None:
        for key in DROPOUT_KEYS:
            if isinstance(getattr(config, key, None), float):
                setattr(config, key, dropout)
    return config


def max_positions(config) -> int | None:
    for key in POSITION_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    return None


def loss_forward(model: nn.Module) -> nn.Module:
    """Give ``model`` (an instance) the training-step call ``model(tokens, targets) -> loss``; see the module doc."""
    model.forward = types.MethodType(_loss_forward, model)  # bound to the instance: a deep copy rebinds it
    return model


def _loss_forward(self, input_ids=None, targets=None, **kwargs):
    own = type(self).forward  # the class's forward on *this* instance (never a closure over another one)
    if targets is None:
        return own(self, input_ids=input_ids, **kwargs)
    logits = own(self, input_ids=input_ids, **kwargs).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def build_hf_model(
    spec: Mapping[str, Any] | str | Path,
    backend: str,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    dropout: float | None = None,
    anatomy: Mapping[str, Any] | None = None,
    seq_len: int | None = None,
) -> nn.Module:
    """A randomly initialised transformers causal LM for ``spec`` with the attention of ``backend`` (sdpa, eager,
    flash_attn -> flash_attention_2), on ``device`` in ``dtype``; its anatomy discovered (or ``anatomy``, a suite's
    stated keys) and checked, or a ValueError saying what could not be decided."""
    transformers = _transformers()
    if backend not in ATTN_IMPLEMENTATION:
        raise ValueError(f"attention backend {backend!r} has no transformers attn_implementation; valid: {', '.join(ATTN_IMPLEMENTATION)}")
    config = hf_config(spec, dropout)
    limit = max_positions(config)
    if seq_len is not None and limit is not None and seq_len > limit:
        raise ValueError(f"seq_len {seq_len} is longer than the config's {limit} positions; raise n_positions / max_position_embeddings")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=ATTN_IMPLEMENTATION[backend])
    model = model.to(dtype=dtype)
    found = stated_anatomy(model, anatomy) if anatomy else discover_anatomy(model)
    if found is None:
        raise ValueError(explain_anatomy(model))
    model.anatomy = types.MethodType(_Stated(found), model)  # get_anatomy asks model.anatomy() first
    model.flashckpt_family = found.family
    return loss_forward(model)


class _Stated:
    """``model.anatomy()`` for a built model: the anatomy found (or stated) when it was built."""

    def __init__(self, anatomy) -> None:
        self.anatomy = anatomy

    def __call__(self, _model):
        return self.anatomy

