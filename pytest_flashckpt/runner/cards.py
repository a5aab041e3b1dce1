"""The model cards of one run, each read once: the suite's preflight (``config.preflight``), the run's resource
check (``runner.preflight.check_run``) and the trainer's build (``runner.run``) all take a card from the run's
``CardShelf`` instead of reading and validating its YAML file again. A card is keyed by its typed identity (the
name or path a scenario gives and the one field a scenario may override, ``dropout``), never by a string built
from a dict."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_flashckpt.config import model_card
from pytest_flashckpt.config.model_card import ModelCard


@dataclass(frozen=True)
class CardKey:
    """A card as a scenario names it: ``card`` (a shipped name or a path) and its ``dropout`` override (None: the
    card's own)."""

    card: str
    dropout: float | None = None


class CardShelf:
    """Cards read once per run (a ``ConfigError`` from a bad card is raised again on every ask: nothing is kept)."""

    def __init__(self) -> None:
        self._cards: dict[CardKey, ModelCard] = {}

    def card(self, card: str, dropout: float | None = None) -> ModelCard:
        key = CardKey(card, dropout)
        if key not in self._cards:
            overrides = {} if dropout is None else {"dropout": dropout}
            self._cards[key] = model_card.load_card(card, **overrides)
        return self._cards[key]

    def load(self, card: str, **overrides) -> ModelCard:
        """``config.model_card.load_card``'s signature (the loader ``config.preflight`` is handed)."""
        unknown = set(overrides) - {"dropout"}
        if unknown:  # a scenario overrides dropout alone: anything else is not a card of this shelf
            return model_card.load_card(card, **overrides)
        return self.card(card, overrides.get("dropout"))
