"""Static checks before anything runs. Per scenario: the model card is readable, the sequence fits it, the
activation strategy fits the model. Per run (``runner.preflight`` calls these with what it resolved): output
folders writable, the predicted host memory and checkpoint disk of each scenario within the machine's. Each
problem is a ``ConfigError`` naming the suite file, the scenario, the key and the fix (``suites/x.yaml: scenario 'foo': model.card: unknown model card 'gpt5-huge' (valid names: ...)``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pytest_flashckpt.config.axes import is_today
from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.model_card import load_card
from pytest_flashckpt.config.scenario import Scenario
from pytest_flashckpt.config.step_impl import card_with_norm, check_simulated


def preflight(scenario: Scenario, where: str | None = None, load: Callable[..., Any] = load_card) -> None:
    """Static checks before anything runs (model card readable, sequence fits, strategy fits the model); raises
    ConfigError naming ``where`` (the suite file the scenario came from; its suite's name when not given), the
    scenario, the key and the fix. ``load`` reads a card (a run's ``runner.cards.CardShelf.load``: once per run)."""
    where = where if where is not None else f"suite {scenario.suite!r}"

    def bad(key: str, problem: str, fix: str = "") -> ConfigError:
        return ConfigError(where, problem, fix, scenario=scenario.name, key=key)

    if getattr(scenario.model, "hf", None) is not None:  # a Hugging Face config, not a card
        return _preflight_hf(scenario, bad)
    try:
        card = load(scenario.card)
    except ConfigError as exc:
        raise exc.within(where, scenario.name, "model.card") from None
    dropout = scenario.model.dropout  # type: ignore[union-attr]
    if dropout is not None:  # the scenario's override of the card's dropout: the bad value is the scenario's
        try:
            load(scenario.card, dropout=dropout)
        except ConfigError as exc:
            raise bad("model.dropout", exc.problem.removeprefix("dropout "), exc.fix) from None
    if scenario.seq_len > card.max_seq_len:
        raise bad("seq_len", f"{scenario.seq_len} exceeds the {card.max_seq_len} positions of model card {card.name!r}",
                  "use a shorter seq_len or a card with more positions")
    # FSDP over every rank splits the batch over them all (a laid-out scenario's own split: Scenario._check_layout)
    if scenario.simulate.enabled and is_today(scenario.layout) and scenario.batch_size % scenario.simulate.world_size:
        raise bad("simulate.world_size", f"{scenario.simulate.world_size} does not divide batch_size {scenario.batch_size}",
                  "use a batch that is a multiple of the world size")
    if scenario.simulate.enabled and scenario.activation.strategy == "budget" and scenario.simulate.world_size != 1:
        raise bad("simulate.world_size", f"{scenario.simulate.world_size}: budget plans are simulated for one device only "
                  "(no per-rank plan costs yet)", "use simulate.world_size 1 for strategy budget")
    refusal = getattr(card, "meta_refusal", lambda: None)() if scenario.simulate.enabled else None
    if refusal is not None:  # e.g. a MoE card's learned routing: refused before anything runs, not at the first forward
        raise bad("simulate.enabled", refusal)
    if scenario.layout.tensor_parallel:  # whole query and key/value heads on every tensor-parallel rank
        layout = scenario.parallel_layout
        tp = layout.tp
        try:
            layout.check_card(card)
        except ValueError as exc:
            problem, _, fix = str(exc).removeprefix(f"layout tp {tp}: ").partition("; ")
            raise bad("layout.tp", f"{tp}: {problem}", fix) from None
    if scenario.activation.strategy == "every_k" and scenario.activation.k > card.num_blocks:
        raise bad("activation.k", f"{scenario.activation.k} is larger than the {card.num_blocks} blocks of {card.name!r}",
                  f"valid: 1..{card.num_blocks}")
    impl = scenario.step_impl
    try:  # the step's norm, optimizer and loss on this card (config.step_impl)
        norm = getattr(card_with_norm(card, impl.norm), "norm", "plain")
        if scenario.simulate.enabled:
            check_simulated(impl, scenario.activation.strategy, scenario.simulate.world_size, norm, scenario.precision,
                            scenario.simulate.target)
    except ValueError as exc:  # "step_impl.norm 'fused': ..." names its key
        message = str(exc)
        key, _, problem = message.partition(" ") if message.startswith("step_impl.") else ("step_impl", "", message)
        raise bad(key, problem) from None


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


# -- the run's resources and output locations (checked once per run, before the first scenario) ------------------

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# values of the width kept per token per block by the reference (no recompute): Korthikanti et al. 2022 count
# 34 * s * b * h bytes per layer at 16 bits (17 values); 14 is used so the prediction stays below every measured
# CPU reference peak of the shipped default suite (sdpa-s256: 136 MiB predicted, 138 MiB measured): a lower
# bound, so a scenario that fits is never refused (eager's s x s scores and dropout masks come on top)
_ACTIVATION_VALUES_PER_TOKEN_AND_WIDTH = 14


def _bytes(n: float) -> str:
    for unit, size in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def state_bytes(scenario: Scenario, card) -> int:
    """One copy of the training state a full save writes: parameters and AdamW's two moments (same dtype)."""
    return 3 * card.num_params() * DTYPE_BYTES[scenario.dtype]


def predicted_host_bytes(scenario: Scenario, card) -> int:
    """A lower bound of the host memory one CPU scenario needs (its reference step runs too): parameters,
    gradients and AdamW state (4 copies of the parameters), the reference's kept activations (14 values of the
    width per token per block) and the logits with their gradient (fp32)."""
    elem = DTYPE_BYTES[scenario.dtype]
    tokens = scenario.batch_size * scenario.seq_len
    state = 4 * card.num_params() * elem
    activations = card.num_blocks * tokens * card.width * _ACTIVATION_VALUES_PER_TOKEN_AND_WIDTH * elem
    logits = 2 * tokens * card.vocab_size * 4
    return state + activations + logits


def checkpoint_disk_bytes(scenario: Scenario, card) -> int:
    """A lower bound of the disk the scenario's checkpoint pass fills at once: the plain reference save keeps every
    one of its saves (a full state each), the strategy at least its newest. 0 without a checkpoint pass."""
    if "checkpoint" not in scenario.measure or scenario.save.strategy == "none":
        return 0
    reference = scenario.reference().save
    kept = reference.saves if scenario.save.strategy != "sync" else min(scenario.save.saves, scenario.save.max_keep or scenario.save.saves)
    return state_bytes(scenario, card) * max(1, kept)


@dataclass(frozen=True)
class ModelShape:
    """What the host-memory and disk predictions read of a model without a card (a Hugging Face config, whose
    parameters ``runner.preflight`` counts with transformers): its name, parameters and widths."""

    name: str
    parameters: int
    num_blocks: int
    width: int
    vocab_size: int
    allocate_on_cpu: bool = True

    def num_params(self) -> int:
        return self.parameters


def check_resources(scenarios, origin, host_bytes: int | None, free_disk: int | None, work_folder: str,
                    on_cpu: bool, shape_of: Callable[[Scenario], Any] | None = None,
                    load: Callable[..., Any] = load_card) -> None:
    """Refuse a scenario whose predicted host memory exceeds ``host_bytes`` (CPU runs of cards built on a CPU) and
    a suite whose checkpoints need more than ``free_disk`` in ``work_folder``. ``origin(scenario)`` names the file
    a scenario came from; ``shape_of(scenario)`` gives a Hugging Face scenario's ``ModelShape`` (None: not
    predicted, as without ``shape_of``)."""
    need_disk, widest, widest_card = 0, None, None
    for scenario in scenarios:
        if getattr(scenario.model, "hf", None) is not None:
            card = shape_of(scenario) if shape_of is not None else None
            if card is None:
                continue
        else:
            card = load(scenario.card)
        # simulated scenarios build nothing; a card too big for a CPU is skipped by the run with its reason
        if on_cpu and host_bytes and not scenario.simulate.enabled and card.allocate_on_cpu:
            need = predicted_host_bytes(scenario, card)
            state = 4 * card.num_params() * DTYPE_BYTES[scenario.dtype]
            if state > host_bytes:  # the model alone: no batch or sequence makes it fit
                hf = getattr(scenario.model, "hf", None) is not None
                raise ConfigError(
                    origin(scenario),
                    f"{card.name!r} has {card.num_params():,} parameters: with their gradients and AdamW state they need "
                    f"at least {_bytes(state)} of host memory, more than this machine's {_bytes(host_bytes)}",
                    "use a smaller model (fewer or narrower layers), or simulate: {enabled: true}",
                    scenario=scenario.name, key="model.hf" if hf else "model.card",
                )
            if need > host_bytes:
                raise ConfigError(
                    origin(scenario),
                    f"{scenario.batch_size} x {scenario.seq_len} tokens of {card.name!r} need at least {_bytes(need)} of "
                    f"host memory (parameters, gradients, AdamW state, activations, logits), more than this machine's "
                    f"{_bytes(host_bytes)}", "use a smaller batch_size or seq_len, or simulate: {enabled: true}",
                    scenario=scenario.name, key="batch_size",
                )
        disk = checkpoint_disk_bytes(scenario, card)
        if disk > need_disk:
            need_disk, widest, widest_card = disk, scenario, card
    if free_disk is not None and widest is not None and need_disk > free_disk:
        raise ConfigError(
            origin(widest),
            f"its checkpoints need at least {_bytes(need_disk)} of disk (state of {_bytes(state_bytes(widest, widest_card))} "
            f"x the saves kept) and {work_folder} has {_bytes(free_disk)} free",
            "free space, pass --flashckpt-workdir=FOLDER on a larger disk, or lower save.saves / save.max_keep",
            scenario=widest.name, key="save.saves",
        )


def check_output_folder(option: str, folder, shown: Callable[[Path], str] = str) -> None:
    """``folder`` (what ``option`` names; ``shown`` writes a path as the user reads it) can be created or written:
    not a file, not below a file, not read-only."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(option, f"{shown(folder)} is a file, not a folder", f"pass {option}=FOLDER, or move the file")
    existing = folder if folder.exists() else next((p for p in folder.parents if p.exists()), Path("."))
    if not existing.is_dir():
        raise ConfigError(option, f"{shown(existing)} is a file, so {shown(folder)} cannot be made", f"pass {option}=FOLDER")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(option, f"{shown(existing)} is not writable",
                          f"pass {option}=FOLDER in a writable place, or fix its permissions")
