"""The MoE family on the simulator: under a forced routing (the family's one routing hook, ``balanced`` or
``capacity``) the meta step's peak equals the cpu probe's measured peak of the same real CPU step to the byte, as
for Llama in tests/simulate/test_simulate_llama.py; the routing assumption moves the peak; a learned routing is
refused on meta with the fix; the large cards answer "will it fit" without allocating anything."""

from pathlib import Path

import pytest
import torch

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.probes.cpu import LiveTensorProbe
from pytest_flashckpt.simulate import simulate_step
from pytest_flashckpt.training import Trainer

BATCH, SEQ = 2, 256  # the activations, not the optimizer step, make moe-tiny's peak here
# wider experts and a smaller vocabulary: the routed experts' tensors, not the logits or the shared expert, set the
# peak of a fully checkpointed step, so the routing assumption shows in it
EXPERT_HEAVY = {"expert_intermediate_size": 520, "vocab_size": 512}


def measured_cpu_peak(card, activation: ActivationConfig) -> tuple[int, int]:
    model = build_model(card, "sdpa", "cpu", torch.float32)
    if activation.strategy != "none":
        apply_ac(model, activation, shape=(BATCH, SEQ))
    trainer = Trainer.create(model, BATCH, SEQ)
    trainer.train_step()
    with LiveTensorProbe().track(trainer.state_tensors()) as reading:
        trainer.train_step()
    return reading.peak_bytes, reading.start_bytes


@pytest.mark.slow
@pytest.mark.parametrize(
    ("routing", "strategy", "overrides"),
    [*(("balanced", s, {}) for s in ("none", "full", "selective_op")), ("capacity", "full", EXPERT_HEAVY),
     pytest.param("balanced", "every_k", {}, marks=pytest.mark.slow),
     pytest.param("capacity", "none", EXPERT_HEAVY, marks=pytest.mark.slow),
     pytest.param("balanced", "budget", {}, marks=pytest.mark.slow)],
)
def test_moe_tiny_simulated_equals_measured(routing, strategy, overrides):
    card = load_card("moe-tiny", routing=routing, **overrides)
    activation = ActivationConfig(strategy=strategy, budget="min + 30%" if strategy == "budget" else None)
    peak, start = measured_cpu_peak(card, activation)
    sim = simulate_step(card, "float32", BATCH, SEQ, "sdpa", strategy, target="cpu", budget=activation.budget)
    assert (sim.peak_bytes, sim.start_bytes) == (peak, start)
    assert sim.peak_phase != "optimizer"  # the step's activations are what is compared
    assert sum(sim.breakdown.values()) == sim.peak_bytes


@pytest.mark.slow
def test_the_routing_assumption_moves_the_simulated_peak():
    """Skewed routing raises the peak over the balanced one, the more the higher the capacity factor (3 on
    moe-tiny: two experts get every token): an expert's intermediate tensors live at once in its backward."""
    peaks = [simulate_step(load_card("moe-tiny", routing=routing, capacity_factor=factor, **EXPERT_HEAVY), "float32",
                           BATCH, SEQ, "sdpa", "full", target="cpu").peak_bytes
             for routing, factor in (("balanced", 1.5), ("capacity", 1.5), ("capacity", 3.0))]
    assert peaks[0] < peaks[1] < peaks[2]


def test_learned_routing_is_refused_on_meta_with_the_fix():
    with pytest.raises(ValueError, match="routing: learned dispatches tokens by their values.*routing: balanced"):
        simulate_step(load_card("moe-tiny", routing="learned"), "float32", 1, 32, "sdpa", "none", target="cpu")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen1.5-moe-a2.7b"])
def test_large_moe_cards_simulate_on_meta(name):
    card = load_card(name, n_layer=2)
    sim = simulate_step(card, "bf16", 1, 1024, "flash", "full")
    assert sim.breakdown["parameters"] == card.num_params() * 2
    assert sim.breakdown["optimizer_state"] == 2 * card.num_params() * 2


def test_a_simulated_scenario_of_a_learned_routing_card_is_refused_by_preflight(tmp_path):
    """Refused before anything runs (preflight), naming the suite, the scenario and the fix; control: the same
    card with balanced routing passes, and measuring (not simulating) the learned card passes too."""
    from pytest_flashckpt.config.errors import ConfigError
    from pytest_flashckpt.config.preflight import preflight
    from pytest_flashckpt.config.scenario import Scenario
    from pytest_flashckpt.config.typed import build

    shipped = (Path(__file__).parents[2] / "models" / "moe-tiny.yaml").read_text()
    for routing in ("learned", "balanced"):
        (tmp_path / f"{routing}.yaml").write_text(shipped.replace("\nrouting: balanced\n", f"\nrouting: {routing}\n"))

    def scenario(routing: str, simulate: bool) -> Scenario:
        return build(Scenario, {"name": "s", "suite": "moe", "model": str(tmp_path / f"{routing}.yaml"), "batch_size": 1,
                                "seq_len": 32, "simulate": {"enabled": simulate, "target": "cpu", "kernel": "sdpa"}}, "moe.yaml")

    with pytest.raises(ConfigError, match=r"moe\.yaml.*\bs\b.*simulate\.enabled.*routing: learned.*routing: balanced"):
        preflight(scenario("learned", True), "moe.yaml")
    preflight(scenario("balanced", True), "moe.yaml")
    preflight(scenario("learned", False), "moe.yaml")
