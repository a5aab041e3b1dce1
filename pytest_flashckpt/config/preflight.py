"""Static checks of a scenario before anything runs: the model card is readable, the sequence fits it, the
activation strategy fits the model. Each problem is a ``ConfigError`` naming the suite file, the scenario, the key
and the fix (``suites/x.yaml: scenario 'foo': model.card: unknown model card 'gpt5-huge' (valid names: ...)``)."""

from __future__ import annotations

from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.model_card import load_card
from pytest_flashckpt.config.scenario import Scenario


def preflight(scenario: Scenario, where: str | None = None) -> None:
    """Static checks before anything runs (model card readable, sequence fits, strategy fits the model); raises
    ConfigError naming ``where`` (the suite file the scenario came from; its suite's name when not given), the
    scenario, the key and the fix."""
    where = where if where is not None else f"suite {scenario.suite!r}"

    def bad(key: str, problem: str, fix: str = "") -> ConfigError:
        return ConfigError(where, problem, fix, scenario=scenario.name, key=key)

    if getattr(scenario.model, "hf", None) is not None:  # a Hugging Face config, not a card
        return _preflight_hf(scenario, bad)
    try:
        card = load_card(scenario.card)
    except ConfigError as exc:
        raise exc.within(where, scenario.name, "model.card") from None
    dropout = scenario.model.dropout  # type: ignore[union-attr]
    if dropout is not None:  # the scenario's override of the card's dropout: the bad value is the scenario's
        try:
            load_card(scenario.card, dropout=dropout)
        except ConfigError as exc:
            raise bad("model.dropout", exc.problem.removeprefix("dropout "), exc.fix) from None
    if scenario.seq_len > card.block_size:
        raise bad("seq_len", f"{scenario.seq_len} exceeds block_size {card.block_size} of model card {card.name!r}",
                  "use a shorter seq_len or a card with more positions")
    if scenario.simulate.enabled and scenario.batch_size % scenario.simulate.world_size:
        raise bad("simulate.world_size", f"{scenario.simulate.world_size} does not divide batch_size {scenario.batch_size}",
                  "use a batch that is a multiple of the world size")
    if scenario.simulate.enabled and scenario.activation.strategy == "budget" and scenario.simulate.world_size != 1:
        raise bad("simulate.world_size", f"{scenario.simulate.world_size}: budget plans are simulated for one device only "
                  "(no per-rank plan costs yet)", "use simulate.world_size 1 for strategy budget")
    if scenario.activation.strategy == "every_k" and scenario.activation.k > card.n_layer:
        raise bad("activation.k", f"{scenario.activation.k} is larger than the {card.n_layer} blocks of {card.name!r}",
                  f"valid: 1..{card.n_layer}")


def _preflight_hf(scenario: Scenario, bad) -> None:
    """A Hugging Face model's sequence and every_k against the layers and positions its config states."""
    from pytest_flashckpt.config.hf_spec import hf_limits

    layers, positions = hf_limits(scenario.model.hf)  # type: ignore[union-attr]
    dropout = scenario.model.dropout  # type: ignore[union-attr]
    if dropout is not None and not 0.0 <= dropout < 1.0:
        raise bad("model.dropout", f"{dropout} is not a probability in [0, 1)", "use e.g. 0.0 or 0.1")
    if positions is not None and scenario.seq_len > positions:
        raise bad("seq_len", f"{scenario.seq_len} exceeds the {positions} positions of the Hugging Face config",
                  "use a shorter seq_len or raise n_positions / max_position_embeddings")
    if layers is not None and scenario.activation.strategy == "every_k" and scenario.activation.k > layers:
        raise bad("activation.k", f"{scenario.activation.k} is larger than the {layers} layers of the Hugging Face config",
                  f"valid: 1..{layers}")
