"""FSDP2 ranks run Hugging Face models: ``distributed.fsdp`` shards the blocks the model's anatomy names (a
transformers Llama's ``model.layers``), not a GPT's ``blocks`` attribute; a world-2 scenario of a Hugging Face
config runs through the runner on gloo, saves with DCP and loads back bit for bit, and its rank peak is read against
the simulated FSDP rank of the same config."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.distributed import fsdp
from pytest_flashckpt.models.anatomy import get_blocks

pytest.importorskip("transformers", reason="Hugging Face models need the optional extra pytest-flashckpt[hf]")

from pytest_flashckpt.models.hf.card import hf_card  # noqa: E402

LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 48, "num_attention_heads": 6,
         "num_key_value_heads": 2, "intermediate_size": 80, "vocab_size": 101, "max_position_embeddings": 64}
SIMULATED_WITHIN = 0.12  # |simulated / measured - 1|, as tests/distributed/test_rank_memory.py allows for cards


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_an_hf_llama_is_sharded_per_decoder_layer(group) -> None:
    trainer, applied = fsdp.build_trainer(hf_card(LLAMA), batch_size=2, seq_len=16, activation=ActivationConfig(strategy="full"))
    layers = get_blocks(trainer.model)
    assert len(layers) == 2 and all(type(layer).__name__ == "FSDPLlamaDecoderLayer" for layer in layers)
    assert type(trainer.model).__name__ == "FSDPLlamaForCausalLM"
    assert all(isinstance(p, DTensor) for p in trainer.model.parameters())
    assert "full" in applied.describe()
    loss = trainer.train_step()
    assert loss.ndim == 0 and torch.isfinite(loss)


@pytest.mark.distributed
@pytest.mark.slow
def test_a_world_2_hf_scenario_runs_saves_and_matches_the_simulated_rank(tmp_path) -> None:
    from pytest_flashckpt.config.scenario import ModelSpec, SaveConfig, Scenario
    from pytest_flashckpt.runner.context import RunContext
    from pytest_flashckpt.runner.runners import measure_scenario
    from pytest_flashckpt.simulate import simulate_step

    scenario = Scenario(
        "hf-llama-fsdp2", model=ModelSpec(hf=LLAMA), suite="t", world_size=2, batch_size=4, seq_len=32, rounds=1,
        attention="sdpa", activation=ActivationConfig(strategy="full"), save=SaveConfig(strategy="dcp", saves=1),
    )  # fmt: skip
    result = measure_scenario(scenario, RunContext(torch.device("cpu"), "cpu", workdir=tmp_path))
    assert result.status == "measured", (result.reason, result.notes)
    assert result.metrics["roundtrip_differences"] == 0 and result.kernel == "sdpa-flash-cpu"
    simulated = simulate_step(hf_card(LLAMA), "float32", 4, 32, "sdpa", "full", target="cpu", world_size=2).peak_bytes
    measured = result.metrics["peak_bytes"]
    assert abs(simulated / measured - 1) <= SIMULATED_WITHIN, (simulated, measured)
