"""The GPT model library: model cards -> GPT modules with a selectable attention kernel."""

from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.models.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig", "build_model", "load_card"]
