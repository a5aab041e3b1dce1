"""FSDP2 mixed precision (``precision="mixed"``): float32 sharded master state, bf16 compute, float32 reduction.

One process, a world-1 gloo group: what is checked is the policy FSDP2 is given and the dtypes it produces, which
do not depend on the world size (the per-rank memory at world 2 and 4 is the distributed suite's)."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from pytest_flashckpt.config.cards.gpt import GPTConfig
from pytest_flashckpt.distributed import fsdp

CARD = GPTConfig(name="odd", vocab_size=131, block_size=64, n_layer=2, n_head=3, n_embd=48)


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_fsdp2_mixed_keeps_fp32_shards_and_computes_in_bf16(group):
    trainer, _ = fsdp.build_trainer(CARD, batch_size=2, seq_len=32, dtype=torch.bfloat16, precision="mixed")
    seen: dict[str, torch.dtype] = {}
    linear = trainer.model.blocks[0].mlp.c_fc
    handle = linear.register_forward_hook(lambda m, args, out: seen.update(weight=m.weight.dtype, out=out.dtype))
    try:
        trainer.train_step()
    finally:
        handle.remove()
    assert seen == {"weight": torch.bfloat16, "out": torch.bfloat16}  # all-gathered in bf16 for the forward
    params = list(trainer.model.parameters())
    assert all(isinstance(p, DTensor) and p.dtype == torch.float32 for p in params)  # fp32 master shards
    state = [v for s in trainer.optimizer.state.values() for k, v in s.items() if k != "step"]
    assert state and all(v.dtype == torch.float32 for v in state)
    policy = trainer.model._get_fsdp_state()._mp_policy
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)


def test_fsdp2_pure_bf16_has_no_policy(group):
    trainer, _ = fsdp.build_trainer(CARD, batch_size=2, seq_len=32, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in trainer.model.parameters())
    assert trainer.model._get_fsdp_state()._mp_policy.param_dtype is None


def test_single_process_reference_of_a_mixed_run_autocasts():
    """``distributed=False`` (the reference a sharded run is read against) is the one-process form: autocast."""
    trainer, _ = fsdp.build_trainer(CARD, batch_size=2, seq_len=32, dtype=torch.bfloat16, precision="mixed", distributed=False)
    assert trainer.autocast == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert trainer.train_step().dtype == torch.float32  # cross entropy runs in fp32 under CPU autocast


@pytest.mark.distributed
@pytest.mark.slow
def test_a_mixed_scenario_runs_under_torchrun_and_round_trips_its_fp32_state(tmp_path):
    """World 2 through the runner: FSDP2 mixed precision trains, holds float32 shards (measured: 396,400 bytes of
    state per rank for 66,000 parameters), saves them with DCP and loads them back bit for bit."""
    from pytest_flashckpt.config.scenario import ActivationConfig, SaveConfig, Scenario
    from pytest_flashckpt.runner.context import RunContext
    from pytest_flashckpt.runner.runners import measure_scenario

    card = tmp_path / "micro.yaml"
    card.write_text("name: micro\nvocab_size: 131\nblock_size: 64\nn_layer: 2\nn_head: 3\nn_embd: 48\n")
    scenario = Scenario(
        "micro-mixed", model=str(card), suite="t", world_size=2, batch_size=2, seq_len=32, rounds=2, attention="sdpa",
        dtype="bfloat16", precision="mixed", activation=ActivationConfig(strategy="full"),
        save=SaveConfig(strategy="dcp", saves=1),
    )  # fmt: skip
    result = measure_scenario(scenario, RunContext(torch.device("cpu"), "cpu", workdir=tmp_path))
    assert result.status == "measured", (result.reason, result.notes)
    assert result.config.precision == "mixed" and result.metrics["roundtrip_differences"] == 0
    n = GPTConfig(name="micro", vocab_size=131, block_size=64, n_layer=2, n_head=3, n_embd=48).num_params()
    assert result.metrics["state_bytes"] >= 12 * n // 2  # a rank's half of fp32 weights + AdamW (pure bf16: 6N / 2)
