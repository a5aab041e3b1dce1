"""Static checks of a suite's Hugging Face model (``model: {hf: ..., anatomy: ...}``) before anything runs, without
transformers or torch: the config names its ``model_type`` (inline, or in a readable ``config.json``), the
anatomy's keys are known, and the scenario's sequence and ``every_k`` fit the config's positions and layers where
the config says them. What needs transformers (the model type exists, the layout is discoverable) is checked when
the model is built (``pytest_flashckpt.models.hf``)."""

from __future__ import annotations

import json
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
