"""Tensor + sequence parallel (tp 2, world 2) and 2D (dp_shard 2 x tp 2, world 4) of a small Llama on gloo ranks:
loss and gradients against one process, the rank probe beside the CPU allocator, a DCP checkpoint of the layout
loaded into one process and into FSDP alone (1D), and one process's checkpoint loaded into the layout, bit for bit. One torchrun launch per layout (~12 s and ~25 s on
this shared 2-core machine), so those are ``slow``; the plan and the layout checks below them are not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("tensor_parallel_worker.py")
STRATEGIES = ("none", "full", "selective_op")
# float32 sums split over tp ranks (row-parallel partial sums, reduce-scatters) differ from one process in the
# last bits: measured max |grad difference| 2.2e-8 on gradients up to 4.8e-2 at tp 2 and at 2 x 2
GRAD_ATOL = 1e-6
LOSS_ATOL = 1e-5


@pytest.fixture(scope="module", params=[(1, 2), (2, 2)], ids=["tp2", "dp2xtp2"])
def launched(request, tmp_path_factory) -> tuple[tuple[int, int], Path, list[dict]]:
    from pytest_flashckpt.distributed import launcher

    dp, tp = request.param
    out = tmp_path_factory.mktemp(f"tp-{dp}x{tp}")
    _one_process_checkpoint(out)
    launcher.run(launcher.Launch(dp * tp, timeout_s=300), str(WORKER), [str(out), str(dp), str(tp), ",".join(STRATEGIES)],
                 log_path=out / "launch.log")
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(dp * tp)]
    return (dp, tp), out, ranks


def _one_process_checkpoint(out: Path) -> None:
    """A DCP checkpoint of a one-process trainer after 3 steps (``out/one``) and its state (``one-ref``), for the
    ranks to load into their layout."""
    from safetensors.torch import save_file

    from pytest_flashckpt.checkpoint import dcp_io
    from pytest_flashckpt.distributed import sharded_store
    from pytest_flashckpt.models.cards import build_model
    from pytest_flashckpt.training import Trainer

    from tensor_parallel_worker import SEED, card

    with dcp_io.process_group():
        trainer = Trainer.create(build_model(card(), "sdpa", "cpu", seed=SEED + 2), 4, 32, seed=SEED)
        for _ in range(3):
            trainer.train_step()
        with sharded_store.ShardedCheckpointer(out / "one") as checkpointer:
            checkpointer.save(trainer)
        state = sharded_store.gathered_state(trainer)
    save_file({k: v.clone().contiguous() for k, v in state.items()}, str(out / "one-ref.safetensors"))


@pytest.mark.distributed
@pytest.mark.slow
def test_loss_and_gradients_match_one_process(launched) -> None:
    for record in launched[2]:
        for strategy, entry in record["strategies"].items():
            assert entry["n_grads"] == 21  # every parameter of the 2-block card, gathered from its DTensor
            assert abs(entry["loss"] - entry["ref_loss"]) <= LOSS_ATOL, (record["rank"], strategy)
            assert entry["grad_max_abs"] <= GRAD_ATOL, (record["rank"], strategy, entry["grad_max_abs"])


@pytest.mark.distributed
@pytest.mark.slow
def test_rank_probe_beside_the_allocator(launched) -> None:
    """The allocator (every thread) and the probe (this thread's dispatcher) differ only by gloo: the copies its
    worker thread stages outside the dispatcher and when that thread lets go of finished collectives' tensors.
    Neither can exceed the collectives' own bytes in the window, so ``|allocator - probe| <=`` the inputs and outputs
    of every collective the rank issued in an identical window (counted by the worker). Measured at tp 2 on a quiet
    2-core AMD host, 12 repeats per strategy: -32,768 to +200,832 B against 0.98-1.28 MB of collectives; 278,528 B
    in a loaded CI run (stop 51), which broke the former bound of 1.5 x the probe's added bytes. Power: it catches a
    probe error larger than the window's collective traffic (1.2-2.4 x the probe's added bytes at tp 2, 2.8-3.7 x at
    dp 2 x tp 2 on this card), so it guards against gross miscounting only; the byte-level check of the probe is the
    fake rank's, below.

    The ordering of the strategies' peaks (full < selective_op < none) is asserted on the simulated rank in
    ``test_simulated_rank_holds_what_the_gloo_rank_holds``, not here, for the same reason: in stop 42's CI at
    dp 2 x tp 2 gloo's hold was 65,536 B for ``full`` and 23,616 B for ``selective_op``, which put full (780,188 B)
    above selective_op (770,652 B) where the simulated rank holds 714,652 < 747,036 B."""
    for record in launched[2]:
        by = record["strategies"]
        for strategy, entry in by.items():
            probe_added = entry["fwd_bwd_peak_bytes"] - entry["fwd_bwd_start_bytes"]
            traffic = entry["collective_fwd_bwd_bytes"]
            assert traffic > 0, (record["rank"], strategy)  # the counter sees the layout's collectives
            assert abs(entry["allocator_fwd_bwd_added_bytes"] - probe_added) <= traffic, (record["rank"], strategy, entry)
    starts = {r["strategies"]["none"]["fwd_bwd_start_bytes"] for r in launched[2]}
    assert len(starts) == 1  # the ranks of a symmetric layout hold the same state (their peaks move with gloo's thread)


@pytest.mark.distributed
@pytest.mark.slow
def test_checkpoint_of_the_layout_loads_bitwise_in_one_process_and_in_1d(launched) -> None:
    from safetensors.torch import load_file

    from pytest_flashckpt.checkpoint import dcp_io
    from pytest_flashckpt.distributed import sharded_store
    from pytest_flashckpt.models.cards import build_model
    from pytest_flashckpt.training import Trainer

    from tensor_parallel_worker import SEED, card

    _, out, ranks = launched
    one_d = ranks[0]["load_1d"]
    assert one_d["tensors"] > 60 and one_d["differences"] == [] and one_d["step"] == 2
    back = ranks[0]["load_from_one_process"]  # and back: a one-process checkpoint loaded into the layout
    assert back["tensors"] == one_d["tensors"] and back["differences"] == [] and back["step"] == 3
    trainer = Trainer.create(build_model(card(), "sdpa", "cpu", seed=SEED + 1), 4, 32, seed=SEED)
    state = sharded_store.load_plain(trainer, sharded_store.latest(out / "ckpt"))
    assert trainer.step == state["step"] == 2
    with dcp_io.process_group():
        gathered = sharded_store.gathered_state(trainer)
    assert sharded_store.bitwise_differences(gathered, load_file(str(out / "ref.safetensors"))) == []


@pytest.mark.distributed
@pytest.mark.slow
def test_simulated_rank_holds_what_the_gloo_rank_holds(launched) -> None:
    """The same engine in one process under fake mode: every window's start and the optimizer peak equal to the
    byte; the forward+backward peak is the gloo rank's less what gloo's worker thread still holds of finished
    collectives (their Work's input and output tensors, released on that thread, so how many depends on when it
    runs: 24,640 to 65,536 B at tp 2 in reports/fake-vs-gloo-layouts.md, 114,688 B for `full` in a
    test run under load). Bounded as gloo's
    staging is (``distributed.memory``): up to GLOO_STAGING_FACTOR full-sequence activations of the rank's rows,
    plus an FSDP all-gather's output."""
    from fresh_python import run_together

    from pytest_flashckpt.distributed.memory import GLOO_STAGING_FACTOR

    from tensor_parallel_worker import BATCH, CARD, SEED, SEQ

    (dp, tp), _, ranks = launched
    cmd = ["-m", "pytest_flashckpt.simulate.fake_ranks", "llama-tiny", "--overrides", json.dumps(CARD), "--layouts", f"{dp}x{tp}",
           "--batch", str(BATCH), "--seq", str(SEQ), "--seed", str(SEED), "--strategies", ",".join(STRATEGIES)]
    mixed = [*cmd[:-2], "--strategies", "none", "--precision", "mixed", "--dtype", "bfloat16"]
    both = run_together({"pure": cmd, "mixed": mixed})
    fake = {**both["pure"][f"{dp}x{tp}"], "mixed": both["mixed"][f"{dp}x{tp}"]["none"]}
    activation = BATCH // dp * SEQ * CARD["n_embd"] * 4  # one float32 (rows, seq, width) activation of this rank
    for record in ranks:
        for strategy in (*STRATEGIES, "mixed"):
            real, sim = record["strategies"].get(strategy, record.get(strategy)), fake[strategy]
            for key in ("fwd_bwd_start_bytes", "optimizer_start_bytes", "optimizer_peak_bytes"):
                assert sim[key] == real[key], (strategy, key, sim[key], real[key])
            gap = real["fwd_bwd_peak_bytes"] - sim["fwd_bwd_peak_bytes"]
            assert 0 <= gap <= GLOO_STAGING_FACTOR * activation + sim["largest_allgather_bytes"], (strategy, gap)
    # checkpointing lowers the peak: asserted where it is deterministic (the gloo rank adds gloo's thread hold, above)
    peaks = [fake[s]["fwd_bwd_peak_bytes"] for s in ("full", "selective_op", "none")]
    assert peaks[0] < peaks[1] < peaks[2], peaks
