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

Checked before a module is built (``hf_config``, ``check_anatomy``, ``parameter_count``; the run's preflight calls
them too): the model type builds a causal LM, the heads divide the hidden size (and the key/value heads the heads),
a stated anatomy fits the first layer's shapes (``check_roles``), and the parameters fit the device.
"""

from __future__ import annotations

import copy
import difflib
import math
import os
import types
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from pytest_flashckpt.config.hf_spec import read_hf_config
from pytest_flashckpt.models.hf.anatomy import discover_anatomy, explain_anatomy, stated_anatomy
from pytest_flashckpt.models.hf.attention import ATTN_IMPLEMENTATION as EXPLICIT_KERNELS
from pytest_flashckpt.models.hf.attention import register as register_explicit_kernels

ATTN_IMPLEMENTATION = {"sdpa": "sdpa", "eager": "eager", "flash_attn": "flash_attention_2"}
DROPOUT_KEYS = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout", "hidden_dropout", "dropout")
POSITION_KEYS = ("n_positions", "max_position_embeddings")


class HFUnavailable(ImportError):
    """transformers is not installed (the optional extra ``pytest-flashckpt[hf]``)."""


class HFConfigProblem(ValueError):
    """A Hugging Face config that cannot be built as written: ``key`` (``model.hf.n_head``), the problem, the fix.
    Raised before anything is built, so a front end can place it (file, scenario) as a ``ConfigError``."""

    def __init__(self, key: str, problem: str, fix: str = "") -> None:
        self.key, self.problem, self.fix = key, problem, fix
        super().__init__(f"{key}: {problem}" + (f" ({fix})" if fix else ""))


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
    """A copy of the config's keys (``hf_config`` pops from it): ``spec`` itself, or the config.json it names."""
    if isinstance(spec, Path):
        spec = str(spec)
    if not isinstance(spec, (Mapping, str)):
        raise ValueError(f"model.hf must be a mapping of config keys or a config.json path, got {type(spec).__name__}")
    return dict(read_hf_config(spec if isinstance(spec, str) else dict(spec)))


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
    _check_model_type(transformers, model_type)
    try:
        defaults = transformers.AutoConfig.for_model(model_type)
        vocab = data.get("vocab_size", getattr(defaults, "vocab_size", None))
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):  # a tiny vocabulary: GPT-2's 50256 is out of range
            value = getattr(defaults, key, None)
            if key not in data and isinstance(value, int) and isinstance(vocab, int) and value >= vocab:
                data[key] = None
        _check_shape(defaults, data)
        config = transformers.AutoConfig.for_model(model_type, **data)
    except HFConfigProblem:
        raise
    except ValueError as exc:  # transformers' own validation, often several lines: one line here
        raise ValueError(f"model.hf: model_type {model_type!r}: {' '.join(str(exc).split())}") from None
    # training, not generation: no KV cache. With one, a checkpointed layer's recomputation would append its keys
    # and values to the cache the first forward filled (transformers turns it off under its own checkpointing too)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    if dropout is not None:
        for key in DROPOUT_KEYS:
            if isinstance(getattr(config, key, None), float):
                setattr(config, key, dropout)
    return config


def _check_model_type(transformers, model_type: str) -> None:
    """``model_type`` is one this transformers knows and builds as a causal LM (``AutoModelForCausalLM``)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    causal = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    if model_type in causal:
        return
    close = difflib.get_close_matches(model_type, causal, n=5, cutoff=0.5)
    known = (f"did you mean {', '.join(close)}? " if close else "") + (
        f"{len(causal)} causal LM types, e.g. {', '.join(t for t in ('gpt2', 'llama', 'mistral', 'qwen2', 'gemma') if t in causal)}: "
        "transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES lists them")
    what = ("is not a causal LM (AutoModelForCausalLM cannot build it)" if model_type in CONFIG_MAPPING_NAMES
            else "is not a model type")
    raise HFConfigProblem("model.hf.model_type", f"{model_type!r} {what} in transformers {transformers.__version__}", known)


def _written(config, data: Mapping[str, Any], name: str) -> str:
    """The key the user wrote (or would write) for transformers' standard attribute ``name``: GPT-2 spells
    ``num_attention_heads`` ``n_head`` (the config's ``attribute_map``)."""
    own = getattr(config, "attribute_map", {}).get(name, name)
    return f"model.hf.{name if name in data else own}"


def _check_shape(defaults, data: Mapping[str, Any]) -> None:
    """The sizes the model's modules are built from (``data``'s, else the model type's ``defaults``) are positive
    integers, and the heads divide what they split: an odd head count is otherwise a traceback inside the model
    (GPT-2), a several-line validation error (Llama's hidden size), or silently narrower key/value projections
    (Llama's ``num_key_value_heads``)."""
    names = ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "vocab_size")
    sizes = {}
    for name in names:
        key = _written(defaults, data, name).removeprefix("model.hf.")
        # key/value heads not written follow the attention heads (the defaults' count is the default heads')
        fallback = None if name == "num_key_value_heads" else getattr(defaults, name, None)
        sizes[name] = data[key] if key in data else fallback
    for name, value in sizes.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise HFConfigProblem(_written(defaults, data, name), f"{value!r} must be a positive integer")
    hidden, heads, kv = sizes["hidden_size"], sizes["num_attention_heads"], sizes["num_key_value_heads"]
    if hidden is not None and heads is not None and "head_dim" not in data and hidden % heads:
        raise HFConfigProblem(_written(defaults, data, "num_attention_heads"),
                              f"{heads} heads do not divide the hidden size {hidden} ({_written(defaults, data, 'hidden_size')})",
                              f"use a head count that divides {hidden}, e.g. {_divisor_near(hidden, heads)}")
    if heads is not None and kv is not None and heads % kv:
        raise HFConfigProblem(_written(defaults, data, "num_key_value_heads"),
                              f"{kv} key/value heads do not divide the {heads} attention heads (each key/value head "
                              "serves a whole group of query heads)", f"use a divisor of {heads}, e.g. {_divisor_near(heads, kv)}")


def _divisor_near(total: int, wanted: int) -> int:
    """A divisor of ``total`` at or below ``wanted`` for the fix's example: the nearest within 1000 steps down (a
    hostile size is never scanned whole), else their greatest common divisor."""
    start = min(wanted, total)
    for candidate in range(start, max(start - 1000, 0), -1):
        if total % candidate == 0:
            return candidate
    return math.gcd(total, wanted)


def parameter_count(config) -> int:
    """The parameters ``AutoModelForCausalLM.from_config(config)`` would have (a tied head counted once), without
    building its layers: the model is built on ``meta`` with one and with two layers, and the difference scaled,
    so a config of a billion layers is counted in milliseconds. Per-layer lists in the config (``layer_types``)
    are cut to the layers built."""
    layers = config.num_hidden_layers
    counts = [sum(p.numel() for p in _on_meta(config, built).parameters()) for built in (1, 2)]
    return counts[0] + (layers - 1) * (counts[1] - counts[0])


def _on_meta(config, layers: int) -> nn.Module:
    """The model of ``config`` with its first ``layers`` layers, on meta (allocates nothing)."""
    transformers = _transformers()
    small = copy.deepcopy(config)
    for key, value in config.to_dict().items():
        if isinstance(value, list) and len(value) == config.num_hidden_layers and config.num_hidden_layers >= 2:
            setattr(small, key, value[:layers])
    small.num_hidden_layers = layers
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(small)


def check_anatomy(config, stated: Mapping[str, Any] | None) -> None:
    """The anatomy the model of ``config`` will have (``stated``, a suite's ``anatomy:``, or discovered) checked on
    its first layer built on meta, before anything is built: what ``build_hf_model`` would refuse, refused now."""
    anatomy_of(_on_meta(config, 1), stated)


def _features(module: nn.Module) -> tuple[int, int]:
    """(in, out) features of a matmul module: an ``nn.Linear`` (weight out x in) or transformers' ``Conv1D``
    (weight in x out)."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    rows, cols = module.weight.shape
    return rows, cols


def check_roles(model: nn.Module, anatomy, where: str = "model.anatomy.projections") -> None:
    """Each projection's features fit its role in a block of hidden size ``config.hidden_size``: q, k, v, qkv,
    gate and up read the hidden state; o and down write it; down reads what up (and gate) write; k and v match;
    o reads what q writes. A stated anatomy with two roles swapped (q and down) passes the module checks (both
    are Linear) and would label every matmul wrongly; its shapes tell. (Roles whose shapes coincide, such as
    q and o of a square attention, cannot be told apart this way.)"""
    from pytest_flashckpt.models.anatomy import get_blocks

    hidden = getattr(model.config, "hidden_size", None)
    blocks = get_blocks(model, anatomy)
    if hidden is None or len(blocks) == 0:
        return  # no stated width to hold the roles to
    block = blocks[0]
    roles = anatomy.block.projections
    size = {role: _features(block.get_submodule(name)) for role, name in roles.items()}
    reads_hidden = [r for r in ("qkv", "q", "k", "v", "gate", "up") if r in size]
    writes_hidden = [r for r in ("o", "down") if r in size]

    def refuse(role: str, problem: str) -> None:
        i, o = size[role]
        raise HFConfigProblem(f"{where}.{role}", f"{roles[role]!r} (in {i}, out {o}) {problem}",
                              "check which module is which role: two swapped?")

    for role in reads_hidden:
        if size[role][0] != hidden:
            refuse(role, f"does not read the hidden size {hidden}, which a {role} projection reads")
    for role in writes_hidden:
        if size[role][1] != hidden:
            refuse(role, f"does not write the hidden size {hidden}, which a {role} projection writes")
    pairs = [("down", 0, "up", 1, "reads what up writes"), ("gate", 1, "up", 1, "writes what up writes"),
             ("v", 1, "k", 1, "writes what k writes"), ("o", 0, "q", 1, "reads what q writes")]
    for role, side, other, other_side, rule in pairs:
        if role in size and other in size and size[role][side] != size[other][other_side]:
            refuse(role, f"must match {other} {roles[other]!r} (in {size[other][0]}, out {size[other][1]}): {role} {rule}")


def anatomy_of(model: nn.Module, stated: Mapping[str, Any] | None):
    """The anatomy of a built Hugging Face ``model``: ``stated`` (a suite's ``anatomy:`` keys) or discovered, held
    to the model's blocks and to the roles' shapes (``check_roles``); ValueError saying what does not fit."""
    found = stated_anatomy(model, stated) if stated else discover_anatomy(model)
    if found is None:
        raise ValueError(explain_anatomy(model))
    check_roles(model, found)
    return found



def _refuse_too_large(config, device: torch.device, dtype: torch.dtype) -> None:
    """Refuse, before building, a model whose parameters alone exceed the memory of the device it is built on
    (free CUDA memory, or the host's physical memory): a config of a billion layers would otherwise build modules
    until it is killed. A lower bound: gradients, optimizer state and activations come on top (the run's host
    preflight, ``runner.preflight``, counts those for CPU runs)."""
    if device.type == "meta":
        return
    parameters = parameter_count(config)
    need = parameters * dtype.itemsize
    if device.type == "cuda":
        have = torch.cuda.mem_get_info(device)[0]
    else:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > have:
        layers = _written(config, {}, "num_hidden_layers")
        raise HFConfigProblem("model.hf", f"{parameters:,} parameters ({layers} {config.num_hidden_layers:,}) need "
                              f"{need:,} bytes in {str(dtype).removeprefix('torch.')} alone, more than the {have:,} bytes "
                              f"of {device.type}", "use fewer or narrower layers")


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
    flash_attn -> flash_attention_2, or one of the simulator's explicit kernel ops: ``models.hf.attention``), on ``device`` in ``dtype``; its anatomy discovered (or ``anatomy``, a suite's
    stated keys) and checked, or a ValueError saying what could not be decided."""
    transformers = _transformers()
    if backend in EXPLICIT_KERNELS:  # the simulator's explicit kernel ops on meta (models.hf.attention)
        register_explicit_kernels()
        implementation = EXPLICIT_KERNELS[backend]
    elif backend in ATTN_IMPLEMENTATION:
        implementation = ATTN_IMPLEMENTATION[backend]
    else:
        raise ValueError(f"attention backend {backend!r} has no transformers attn_implementation; valid: "
                         f"{', '.join([*ATTN_IMPLEMENTATION, *EXPLICIT_KERNELS])}")
    config = hf_config(spec, dropout)
    limit = max_positions(config)
    if seq_len is not None and limit is not None and seq_len > limit:
        raise ValueError(f"seq_len {seq_len} is longer than the config's {limit} positions; raise n_positions / max_position_embeddings")
    _refuse_too_large(config, torch.device(device), dtype)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=implementation)
    if any(t.dtype != dtype for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()):
        model = model.to(dtype=dtype)  # only when needed: under fake tensors (simulate.compiled) it cannot swap
    found = anatomy_of(model, anatomy)
    model.anatomy = types.MethodType(_Stated(found), model)  # get_anatomy asks model.anatomy() first
    model.flashckpt_family = found.family
    return loss_forward(model)


class _Stated:
    """``model.anatomy()`` for a built model: the anatomy found (or stated) when it was built."""

    def __init__(self, anatomy) -> None:
        self.anatomy = anatomy

    def __call__(self, _model):
        return self.anatomy

