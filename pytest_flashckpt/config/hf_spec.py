"""Static checks of a suite's Hugging Face model (``model: {hf: ..., anatomy: ...}``) before anything runs, without
transformers or torch: the config names its ``model_type`` (inline, or in a readable ``config.json``), the
anatomy's keys are known, and the scenario's sequence and ``every_k`` fit the config's positions and layers where
the config says them; each ``anatomy:`` value has its key's form, and no value is NaN or infinite. What needs
transformers (the model type builds a causal LM, the heads divide, the anatomy fits the model's shapes, the size)
is checked by the run's preflight (``runner.preflight.hf_shape``) and again when the model is built
(``pytest_flashckpt.models.hf.build``)."""

from __future__ import annotations

import json
import reprlib
from pathlib import Path
from typing import Any

from pytest_flashckpt.config.typed import first_non_finite

ANATOMY_KEYS = ("blocks", "projections", "attention", "norms", "embeddings", "head", "final_norm", "tied")
LAYER_KEYS = ("n_layer", "num_hidden_layers", "num_layers")
POSITION_KEYS = ("n_positions", "max_position_embeddings")


def read_hf_config(hf: dict | str) -> dict[str, Any]:
    """The config's keys: ``hf`` itself, or the JSON object in the file it names (ValueError naming the problem)."""
    if isinstance(hf, dict):
        return hf
    path = Path(hf)
    if not path.is_file():
        raise ValueError(f"model.hf: {hf!r} is not a file; give a config.json path or the config's keys inline")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"model.hf: {path} is not a readable JSON config ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"model.hf: {path} must hold a JSON object (a transformers config.json)")
    found = first_non_finite(data, "model.hf")
    if found is not None:  # JSON's NaN / Infinity, which Python's json reads as floats
        raise ValueError(f"{found[0]}: {found[1]!r} in {path} is not a finite number; write a finite number")
    return data


def check_hf_spec(hf: dict | str, anatomy: dict | None) -> None:
    data = read_hf_config(hf)
    if not isinstance(data.get("model_type"), str):
        raise ValueError("model.hf: 'model_type' is required (gpt2, llama, ...), as in a transformers config.json")
    if anatomy is not None:
        unknown = sorted(set(anatomy) - set(ANATOMY_KEYS))
        if unknown:
            raise ValueError(f"model.anatomy: unknown key(s) {', '.join(unknown)}; valid: {', '.join(ANATOMY_KEYS)}")
        check_anatomy_types(anatomy)


_NAME_KEYS = ("blocks", "attention", "head", "final_norm")  # one dotted module name each
_NAMES_KEYS = ("norms", "embeddings")  # a list of module names each


def check_anatomy_types(anatomy: dict) -> None:
    """Each ``anatomy:`` value has the form its key takes (a module name, a list of names, roles to names, pairs
    of parameter names), so a wrong one is a line naming the key, not a traceback from the module lookup. Whether
    the names exist and fit their roles needs the model (``models.hf.build.check_anatomy``)."""
    def module_name(value) -> bool:
        return isinstance(value, str) and bool(value.strip())

    for key in _NAME_KEYS:
        if key in anatomy and not (module_name(anatomy[key]) or (key == "head" and anatomy[key] is None)):
            raise ValueError(f"model.anatomy.{key}: {reprlib.repr(anatomy[key])} must be a module name such as "
                             f"{'model.layers' if key == 'blocks' else 'self_attn' if key == 'attention' else 'lm_head'}")
    for key in _NAMES_KEYS:
        if key in anatomy and not (isinstance(anatomy[key], list) and all(module_name(v) for v in anatomy[key])):
            raise ValueError(f"model.anatomy.{key}: {reprlib.repr(anatomy[key])} must be a list of module names")
    projections = anatomy.get("projections")
    if projections is not None and not (isinstance(projections, dict) and all(module_name(v) for v in projections.values())):
        raise ValueError(f"model.anatomy.projections: {reprlib.repr(projections)} must map roles to module names, "
                         "e.g. {q: self_attn.q_proj, ..., down: mlp.down_proj}")
    tied = anatomy.get("tied")
    if tied is not None and not (isinstance(tied, list) and all(
            isinstance(p, list) and len(p) == 2 and all(module_name(n) for n in p) for p in tied)):
        raise ValueError(f"model.anatomy.tied: {reprlib.repr(tied)} must be a list of [alias, owner] parameter-name pairs, "
                         "e.g. [[lm_head.weight, model.embed_tokens.weight]]")


def hf_limits(hf: dict | str) -> tuple[int | None, int | None]:
    """(layers, positions) the config states, None where it does not (transformers' defaults then apply)."""
    data = read_hf_config(hf)
    layers = next((data[k] for k in LAYER_KEYS if isinstance(data.get(k), int)), None)
    positions = next((data[k] for k in POSITION_KEYS if isinstance(data.get(k), int)), None)
    return layers, positions


def hf_label(hf: dict | str) -> str:
    """How reports name a Hugging Face model in their card column: ``hf:gpt2``, ``hf:llama``, ``hf:config.json``."""
    if isinstance(hf, str):
        return f"hf:{Path(hf).name}"
    return f"hf:{hf.get('model_type', '?')}"
