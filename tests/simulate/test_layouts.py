"""``flashckpt simulate --tp``: one rank of a dp_shard x tp layout simulated by the real engine under fake mode
(simulate.fake_ranks), its state counted against arithmetic on the card, and bad layout requests refused before
anything runs. The fake ranks run in this process through ``python -m pytest_flashckpt.simulate.fake_ranks``'s
``main``, one after the other (``simulate_rank`` starts the fake process group and destroys it after each depth;
none is left up, checked)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

from pytest_flashckpt.cli import main
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.simulate.fake_ranks import main as fake_ranks_main

CARD = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_kv_head": 2, "intermediate_size": 88, "vocab_size": 256, "block_size": 64}
BATCH, SEQ = 4, 32


def _local_param_bytes(dp: int, tp: int) -> tuple[int, int]:
    """(bytes of rank 0's parameters, how many parameters) by arithmetic: every matrix split tp ways (its sharded
    dimension divides here), the norms replicated over tp; then every tensor split dp ways (FSDP2, dim 0)."""
    model = build_model(load_card("llama-tiny", **CARD), "sdpa", "meta")
    total = 0
    for name, param in model.named_parameters():
        numel = param.numel() // (1 if "norm" in name else tp)
        total += numel // dp * param.element_size()
    return total, len(list(model.parameters()))


@pytest.fixture(scope="module")
def fake_ranks() -> dict:
    """``python -m pytest_flashckpt.simulate.fake_ranks``'s ``main``, called here (no fresh interpreter, no second
    torch import), its JSON read back from stdout."""
    argv = ["llama-tiny", "--overrides", json.dumps(CARD), "--layouts", "1x2,2x2,2x1", "--batch", str(BATCH), "--seq", str(SEQ),
            "--strategies", "none,full"]
    assert not torch.distributed.is_initialized()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fake_ranks_main(argv)
    assert not torch.distributed.is_initialized()  # each fake process group was destroyed: nothing left for the next test
    records = json.loads(out.getvalue().strip().splitlines()[-1])
    return {tuple(int(n) for n in name.split("x")): by_strategy for name, by_strategy in records.items()}


@pytest.mark.slow
@pytest.mark.parametrize("dp,tp", [(1, 2), (2, 2), (2, 1)])
def test_the_simulated_rank_holds_its_shards_and_adamw_state(fake_ranks, dp: int, tp: int) -> None:
    params, count = _local_param_bytes(dp, tp)
    for record in fake_ranks[(dp, tp)].values():
        # parameters + AdamW's two moments (the local shards) + one float32 step count per parameter
        assert record["fwd_bwd_start_bytes"] == 3 * params + 4 * count
        gradients_and_more = record["optimizer_start_bytes"] - record["fwd_bwd_start_bytes"]
        if dp > 1:  # the local gradients and nothing all-gathered: FSDP2 has resharded every parameter by then
            assert gradients_and_more == params
        else:  # tp alone (no FSDP): the local gradients and what the step still holds at its end
            assert gradients_and_more >= params
    assert fake_ranks[(dp, tp)]["full"]["fwd_bwd_peak_bytes"] < fake_ranks[(dp, tp)]["none"]["fwd_bwd_peak_bytes"]


@pytest.mark.slow
def test_fsdp_over_tp_halves_the_state_and_lowers_the_peak(fake_ranks) -> None:
    tp_only, two_d = fake_ranks[(1, 2)]["none"], fake_ranks[(2, 2)]["none"]
    assert two_d["peak_bytes"] < tp_only["peak_bytes"]
    assert two_d["largest_allgather_bytes"] > 0 == tp_only["largest_allgather_bytes"]  # FSDP gathers only in 2D


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "llama-tiny", "--tp", "4", "--world-size", "4"], "model card 'llama-tiny' has n_head 6, not divisible by tp"),
        (["--model", "llama-tiny", "--tp", "2", "--world-size", "3"], "world size 3 is not divisible by tp 2"),
        (["--model", "llama-tiny", "--tp", "2", "--world-size", "4", "--batch", "3"], "batch 3 is not divisible by dp_shard 2"),
        (["--model", "llama-tiny", "--tp", "2", "--world-size", "2", "--budget", "0.5"], "--tp 2: --strategy budget is not simulated by the engine yet"),
        (["--model", "llama-tiny", "--tp", "2", "--world-size", "2", "--kernel", "eager"], "--tp 2: --kernel eager --target cuda: the engine's rank runs the CPU flash-attention op"),
        (["--model", "llama-tiny", "--tp", "2", "--world-size", "2", "--optimizer", "sgd"], "--tp 2: --norm/--optimizer/--loss"),
        (["--model", "llama-tiny", "--world-size", "2", "--precision", "mixed", "--dtype", "fp32"], "--precision mixed computes in bf16"),
        (["--model", "llama-tiny", "--tp", "0"], "tp must be a positive integer, got 0"),
        (["--model", "llama-tiny", "--tp", "2", "--world-size", "2", "--seq", "4096"], "--seq 4096 exceeds block_size 2048"),
        (["--model", "llama-tiny", "--world-size", "2", "--seq", "4096"], "--world-size 2: sequence length 4096 is longer than the 2048 positions"),
        (["--model", "tiny", "--tp", "2", "--world-size", "2"], "fused q/k/v projection 'attn.c_attn'"),
        (["--model", "no-such-card", "--tp", "2", "--world-size", "2"], "no-such-card"),
    ],
)
def test_bad_layout_requests_exit_2_naming_the_option(argv, message, capsys) -> None:
    assert main(["simulate", "--seq", "128", "--batch", "4", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not torch.distributed.is_initialized()  # refused before the fake process group starts


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["pure", "mixed"])
def test_world_size_alone_is_answered_by_the_engine(precision, capsys) -> None:
    """``--world-size N`` at tp 1 is FSDP2's ``fully_shard`` under fake mode, in mixed precision too
    (``MixedPrecisionPolicy``); the optimizer window starts at the local state plus the local gradients."""
    argv = ["simulate", "--model", "llama-tiny", "--seq", "32", "--batch", "4", "--world-size", "2", "--dtype", "bf16",
            "--precision", precision, "--strategy", "full"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "per rank of 2 (FSDP, batch 2 per rank)" in out
    assert "simulated by torch's fully_shard under FakeTensorMode" in out and "modelled" not in out
    assert not torch.distributed.is_initialized()


def test_what_the_engine_cannot_run_stays_modelled_at_tp_1(capsys) -> None:
    argv = ["simulate", "--model", "tiny", "--seq", "32", "--batch", "4", "--world-size", "2", "--optimizer", "sgd"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "predicted peak" in out and "FSDP modelled, not run by the engine: --norm/--optimizer/--loss" in out
