"""The anatomy of a Hugging Face causal LM, discovered from its module names (GPT-2, Llama) or stated by the user.

Discovery reads the module tree, never a class list alone: a GPT-2 layout is ``transformer.h`` blocks with
``attn.c_attn`` / ``attn.c_proj`` / ``mlp.c_fc`` / ``mlp.c_proj`` (transformers' ``Conv1D``); a Llama layout is
``model.layers`` blocks with ``self_attn.{q,k,v,o}_proj`` and ``mlp.{gate,up,down}_proj`` (Llama, Qwen2, Mistral
and the other models transformers lays out like Llama). ``models.families`` registers ``discover_anatomy`` (lazily:
this module is imported the first time a transformers model is met), so the package's import alone suffices. The tie is read from the
live model (the head's weight *is* the embedding's), not from ``_tied_weights_keys``, which transformers declares on
the class whether or not this config ties (an untied Llama's head is its own parameter). Every discovered block is
then held to the anatomy (``check_block``), so a layout that looks like one of these but holds other matmuls is an
error naming the block and the modules, never a silent mislabel. This module does not import transformers.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch.nn as nn

from pytest_flashckpt.models.anatomy import BlockAnatomy, ModelAnatomy, block_names, check_block, get_blocks

GPT2 = {
    "blocks": "transformer.h",
    "projections": {"qkv": "attn.c_attn", "o": "attn.c_proj", "up": "mlp.c_fc", "down": "mlp.c_proj"},
    "attention": "attn",
    "norms": ("ln_1", "ln_2"),
    "embeddings": ("transformer.wte", "transformer.wpe"),
    "head": "lm_head",
    "final_norm": "transformer.ln_f",
}
LLAMA = {
    "blocks": "model.layers",
    "projections": {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
                    "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"},
    "attention": "self_attn",
    "norms": ("input_layernorm", "post_attention_layernorm"),
    "embeddings": ("model.embed_tokens",),
    "head": "lm_head",
    "final_norm": "model.norm",
}
LAYOUTS = {"hf-gpt2": GPT2, "hf-llama": LLAMA}
STATED_KEYS = ("blocks", "projections", "attention", "norms", "embeddings", "head", "final_norm", "tied")


def is_hf_model(model: nn.Module) -> bool:
    """A transformers ``PreTrainedModel`` (recognised by its class's module, so transformers is not imported)."""
    return any(cls.__module__.startswith("transformers.") and cls.__name__ == "PreTrainedModel" for cls in type(model).__mro__)


def tied_pairs(model: nn.Module, head: str | None, embeddings: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(alias, owner) parameter names for a head whose weight is one of the embeddings' weights, live."""
    if head is None:
        return ()
    try:
        head_weight = model.get_submodule(head).weight
    except AttributeError:
        return ()
    for name in embeddings:
        weight = getattr(model.get_submodule(name), "weight", None)
        if weight is not None and weight is head_weight:
            return ((f"{head}.weight", f"{name}.weight"),)
    return ()


def _build(model: nn.Module, family: str, layout: Mapping[str, Any]) -> ModelAnatomy:
    block = BlockAnatomy(layout["projections"], layout["attention"], tuple(layout.get("norms", ())))
    embeddings = tuple(layout.get("embeddings", ()))
    head = layout.get("head")
    tied = layout.get("tied")
    tied = tuple(tuple(p) for p in tied) if tied is not None else tied_pairs(model, head, embeddings)
    anatomy = ModelAnatomy(family, layout["blocks"], block, embeddings, head, layout.get("final_norm"), tied)
    blocks = get_blocks(model, anatomy)
    for name, b in zip(block_names(model, blocks), blocks):
        check_block(anatomy, b, where=name)
    names = dict(model.named_modules())
    missing = [n for n in (*embeddings, head, anatomy.final_norm) if n is not None and n not in names]
    if missing:
        raise ValueError(f"{family} anatomy names module(s) {', '.join(missing)}, which a {type(model).__name__} does not have")
    return anatomy


def _matches(model: nn.Module, layout: Mapping[str, Any]) -> bool:
    names = dict(model.named_modules())
    blocks = names.get(layout["blocks"])
    if not isinstance(blocks, nn.ModuleList) or len(blocks) == 0:
        return False
    inner = dict(blocks[0].named_modules())
    return all(p in inner for p in layout["projections"].values())


def discover_anatomy(model: nn.Module) -> ModelAnatomy | None:
    """The anatomy of a Hugging Face GPT-2 or Llama layout; None for any other model (so other discoverers are
    asked). A model that matches a layout's names but not its blocks' matmuls raises ValueError (check_block)."""
    if not is_hf_model(model):
        return None
    for family, layout in LAYOUTS.items():
        if _matches(model, layout):
            return _build(model, family, layout)
    return None


def explain_anatomy(model: nn.Module) -> str:
    """Why no anatomy was discovered for ``model``: what was looked for and what could not be decided."""
    lists = [(n, len(m)) for n, m in model.named_modules() if isinstance(m, nn.ModuleList)]
    found = ", ".join(f"{n} ({k} modules)" for n, k in lists) or "no nn.ModuleList"
    model_type = getattr(getattr(model, "config", None), "model_type", "?")
    return (
        f"cannot decide the anatomy of a {type(model).__name__} (model_type {model_type!r}): discovery knows GPT-2 "
        f"(transformer.h blocks with attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) and Llama (model.layers blocks "
        f"with self_attn.q/k/v/o_proj, mlp.gate/up/down_proj) layouts; this model has {found}, so which list holds "
        "the decoder blocks and which module of a block is which projection is unknown. State it in the suite: "
        "model: {anatomy: {blocks: ..., projections: {q: ..., ...}, attention: ..., norms: [...], embeddings: [...], "
        "head: ...}}"
    )


def stated_anatomy(model: nn.Module, stated: Mapping[str, Any], where: str = "model.anatomy") -> ModelAnatomy:
    """An anatomy from a suite's ``anatomy:`` keys (``STATED_KEYS``), held to the model's blocks. A partial
    statement fills the rest from the discovered layout when there is one."""
    unknown = sorted(set(stated) - set(STATED_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(STATED_KEYS)}")
    base: dict[str, Any] = {}
    for layout in LAYOUTS.values():
        if _matches(model, layout):
            base = dict(layout)
            break
    layout = {**base, **dict(stated)}
    for key in ("blocks", "projections", "attention"):
        if key not in layout:
            raise ValueError(f"{where}: {key!r} is required (no known layout to take it from)")
    try:
        return _build(model, "custom", layout)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None

