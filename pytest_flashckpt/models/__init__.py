"""The model library: model cards -> modules of a family (``gpt``, ``llama``: each a folder that registers itself,
``models.families``) with a selectable attention kernel."""

from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.models.gpt import GPT, GPTConfig
from pytest_flashckpt.models.llama import Llama, LlamaConfig

__all__ = ["GPT", "GPTConfig", "Llama", "LlamaConfig", "build_model", "load_card"]
