"""A Hugging Face config as a card: what the simulator (``simulate_step``, its planner costs) and an FSDP rank
(``distributed.fsdp``) read of a model card (name, layers, positions, heads, widths, vocabulary, attention
dropout), read from the transformers config, and ``build`` (the model from that config by ``build_hf_model``, the
one builder measured runs use too).

``hf_card(spec)`` checks the config the way a run's preflight does (the model type builds a causal LM, the heads
divide, the anatomy is discovered or stated and fits the first layer), on a one-layer model on ``meta``; a model
type whose layout discovery does not know is refused as not supported, naming the types that are and the fix
(state the anatomy), never as a card-schema key error.

The card is frozen and hashable (the config's keys as sorted JSON), so the simulator's caches (the suite runner's
per-scenario cache, ``SimulatedCosts.shared``) key on it as on a model card.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.nn as nn

from pytest_flashckpt.config.card_names import DecoderCardNames
from pytest_flashckpt.config.hf_spec import hf_label, read_hf_config
from pytest_flashckpt.models.hf.anatomy import LAYOUTS
from pytest_flashckpt.models.hf.build import HFConfigProblem, build_hf_model, check_anatomy, hf_config, max_positions

ATTENTION_DROPOUT_KEYS = ("attn_pdrop", "attention_dropout")
# model types transformers lays out as GPT-2 or Llama (discovery reads module names; these are the ones tested)
KNOWN_LAYOUT_TYPES = ("gpt2", "llama", "mistral", "qwen2")


@dataclass(frozen=True)
class HFCard(DecoderCardNames):
    """A Hugging Face config as a card (see the module doc). ``config_json``: the config's keys;
    ``dropout``: the suite's override of every dropout (None: the config's own); ``anatomy_json``: a stated anatomy."""

    name: str
    config_json: str
    n_layer: int
    block_size: int
    n_head: int
    n_embd: int
    vocab_size: int
    intermediate_size: int
    dropout: float  # attention dropout after the override: which SDPA path a CPU takes (simulate.kernels)
    dropout_override: float | None = None
    anatomy_json: str | None = None
    family: str = "hf"
    allocate_on_cpu: bool = True

    # the card protocol's other neutral names: config.card_names.DecoderCardNames
    @property
    def mlp_width(self) -> int:
        return self.intermediate_size

    @property
    def spec(self) -> dict[str, Any]:
        return json.loads(self.config_json)

    @property
    def anatomy(self) -> dict[str, Any] | None:
        return None if self.anatomy_json is None else json.loads(self.anatomy_json)

    def build(self, backend: str, device: torch.device | str, dtype: torch.dtype, seed: int = 0) -> nn.Module:
        """The model on ``device`` with the simulated ``backend`` (an explicit kernel op, ``sdpa`` or ``eager``);
        ``model.backend`` names it, as the project's models do. On ``meta``, ``sdpa`` runs through
        ``models.hf.attention``'s ``sdpa-math`` (transformers' own SDPA call without its mask preparation, which reads
        tensor values); ``eager`` is refused there (its T x T mask is built the same way)."""
        built = backend
        if torch.device(device).type == "meta":
            if backend == "eager":
                raise ValueError(f"{self.name}: kernel eager is not simulated for a Hugging Face config (transformers "
                                 "builds its T x T mask by reading tensor values, which meta tensors do not have); "
                                 "use kernel sdpa, flash or efficient")
            built = "sdpa-math" if backend == "sdpa" else backend
        model = build_hf_model(self.spec, built, device, dtype, seed=seed, dropout=self.dropout_override, anatomy=self.anatomy)
        model.backend = backend
        return model


def hf_card(spec: Mapping[str, Any] | str | Path, dropout: float | None = None, anatomy: Mapping[str, Any] | None = None) -> HFCard:
    """The card of ``spec`` (config keys or a config.json path); HFConfigProblem / ValueError naming the key and the
    fix for a config the builder cannot take (see the module doc)."""
    data = read_hf_config(str(spec) if isinstance(spec, Path) else spec)
    config = hf_config(data, dropout)
    _check_supported(config, anatomy)
    hidden, heads = config.hidden_size, config.num_attention_heads
    width = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden
    attention_dropout = next((float(getattr(config, k)) for k in ATTENTION_DROPOUT_KEYS
                              if isinstance(getattr(config, k, None), (int, float))), 0.0)
    return HFCard(
        name=hf_label(str(spec) if isinstance(spec, Path) else spec), config_json=json.dumps(data, sort_keys=True),
        n_layer=config.num_hidden_layers, block_size=max_positions(config) or 2**62, n_head=heads, n_embd=hidden,
        vocab_size=config.vocab_size, intermediate_size=width, dropout=attention_dropout, dropout_override=dropout,
        anatomy_json=None if anatomy is None else json.dumps(dict(anatomy), sort_keys=True),
    )


def _check_supported(config, anatomy: Mapping[str, Any] | None) -> None:
    """The anatomy of the config's model, checked on its first layer built on meta: a layout discovery does not
    know (and no stated anatomy) is "not supported", with the types that are and the fix."""
    try:
        check_anatomy(config, anatomy)
    except ValueError as exc:
        if anatomy is not None:
            raise
        layouts = ", ".join(f"{name.removeprefix('hf-')} ({LAYOUTS[name]['blocks']} blocks)" for name in LAYOUTS)
        raise HFConfigProblem(
            "model.hf.model_type",
            f"model_type {config.model_type!r} is not supported: the simulator and FSDP ranks take the {layouts} "
            f"layouts (e.g. {', '.join(KNOWN_LAYOUT_TYPES)}); its model has {_first_clause(exc)}",
            "state its anatomy in a suite: model: {hf: ..., anatomy: {blocks: ..., projections: ...}}",
        ) from None


def _first_clause(exc: ValueError) -> str:
    text = str(exc)
    marker = "this model has "
    return text[text.index(marker) + len(marker):].split(", so ")[0] if marker in text else text.split(";")[0]
