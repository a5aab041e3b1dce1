"""Static checks of a scenario before anything runs: the model card is readable, the sequence fits it, the
activation strategy fits the model. Each problem is a ``ConfigError`` naming the scenario and the fix."""

from __future__ import annotations

from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.model_card import load_card
from pytest_flashckpt.config.scenario import Scenario


def preflight(scenario: Scenario) -> None:
    """Static checks before anything runs (model card readable, sequence fits, strategy fits the model);
    raises ConfigError naming the scenario and the fix."""
    where = f"{scenario.suite}::{scenario.name}"
    card = load_card(scenario.card)
    if scenario.seq_len > card.block_size:
        raise ConfigError(where, f"seq_len {scenario.seq_len} exceeds block_size {card.block_size} of model card {card.name!r}", "use a shorter seq_len or a card with more positions")
    if scenario.simulate.enabled and scenario.batch_size % scenario.simulate.world_size:
        raise ConfigError(where, f"simulate.world_size {scenario.simulate.world_size} does not divide batch_size {scenario.batch_size}", "use a batch that is a multiple of the world size")
    if scenario.activation.strategy == "every_k" and scenario.activation.k > card.n_layer:
        raise ConfigError(where, f"activation.k {scenario.activation.k} is larger than the {card.n_layer} blocks of {card.name!r}", f"valid: 1..{card.n_layer}")
