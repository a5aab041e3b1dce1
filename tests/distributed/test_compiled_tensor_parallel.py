"""Compiled ranks laid out by the engine (issue 32 item 7, issue 33): tp 2 (world 2), dp_shard 2 x tp 2 (world 4) and
FSDP alone over 2 ranks (dp_shard 2, tp 1) of a small Llama, every block compiled by Inductor after the activation
strategy and before ``fully_shard`` (torchtitan's order), under tensor parallel the embedding's output settled in
eager first (``tensor_parallel.settle_embedding_output``). Per strategy the config accepts
(``registry.tensor_parallel_compiled_strategies()``, and ``registry.whole_block_strategies()`` with ``ac_wrapper:
outside``; FSDP alone those inside too): the first step's loss and every gradient against one eager process, one
graph and no break, then steps that go on training; and the rank simulated by the engine compiled under fake mode
against the gloo rank's probe. One torchrun launch per layout (~40-90 s with cold compiles on 2 cores), so
``slow``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_flashckpt.core.registry import tensor_parallel_compiled_strategies, whole_block_strategies

WORKER = Path(__file__).with_name("compiled_tensor_parallel_worker.py")
# as the eager layouts (test_tensor_parallel): measured max |grad difference| 2.0e-8 for each strategy at tp 2 and 2 x 2
GRAD_ATOL = 1e-6
LOSS_ATOL = 1e-5
# what the config accepts under tensor parallel: the checkpoint inside the compiled block, and full / every_k with it
# outside (compile.ac_wrapper, written "full:outside" to the worker)
STRATEGIES = [*tensor_parallel_compiled_strategies(), *(f"{s}:outside" for s in whole_block_strategies())]
# FSDP alone (dp_shard 2, tp 1) compiles every fixed strategy with the checkpoint inside the block too
FSDP_STRATEGIES = [*STRATEGIES, *whole_block_strategies()]


def _strategies(tp: int) -> list[str]:
    return STRATEGIES if tp > 1 else FSDP_STRATEGIES


@pytest.fixture(scope="module", params=[(1, 2), (2, 2), (2, 1)], ids=["tp2", "dp2xtp2", "fsdp2"])
def launched(request, tmp_path_factory) -> tuple[int, int, list[dict]]:
    """(dp_shard, tp, every rank's record)."""
    from pytest_flashckpt.compile_step import compiler_missing
    from pytest_flashckpt.distributed import launcher

    if compiler_missing():
        pytest.skip(compiler_missing())
    dp, tp = request.param
    out = tmp_path_factory.mktemp(f"tpc-{dp}x{tp}")
    strategies = ",".join(_strategies(tp))
    launcher.run(launcher.Launch(dp * tp, timeout_s=600), str(WORKER), [str(out), str(dp), str(tp), strategies],
                 log_path=out / "launch.log")
    return dp, tp, [json.loads((out / f"rank-{r}.json").read_text()) for r in range(dp * tp)]


@pytest.mark.distributed
@pytest.mark.slow
def test_a_compiled_tensor_parallel_block_trains_as_one_eager_process(launched) -> None:
    _, tp, records = launched
    for record in records:
        assert set(record["strategies"]) == set(_strategies(tp))
        for strategy, entry in record["strategies"].items():
            where = (record["rank"], strategy)
            assert "error" not in entry, (where, entry.get("error"))
            assert entry["no_grad"] == [] and entry["n_grads"] == 21, where  # the embedding's gradient too
            assert entry["graphs"] >= 1 and entry["breaks"] == 0, where
            assert abs(entry["loss"] - entry["ref_loss"]) <= LOSS_ATOL, where
            assert entry["grad_max_abs"] <= GRAD_ATOL, (where, entry["grad_max_abs"])


@pytest.mark.distributed
@pytest.mark.slow
def test_the_engine_compiled_under_fake_mode_holds_what_the_gloo_rank_holds(launched) -> None:
    """The compiled rank simulated (``simulate_rank(compile=...)``: the same build under fake mode and torch's fake
    process group, Inductor's own plans, kernels stubbed) against each gloo rank read by the same probe: every
    window's start and the optimizer peak equal to the byte. The forward+backward peak: the gloo rank's is higher
    only by what gloo's thread still holds of finished collectives, bounded as for the eager layouts
    (test_tensor_parallel). That holds because the worker allocates Inductor's buffers through the dispatcher
    (``probes.compiled.inductor_buffers_dispatched``, as ``distributed.rank`` does): through Inductor's own helper
    the probe missed some, and the fake rank read above it (reports/spike-compiled-fake-ranks.md)."""
    from pytest_flashckpt.config.axes import CompileConfig
    from pytest_flashckpt.config.layout import Layout
    from pytest_flashckpt.distributed.memory import GLOO_STAGING_FACTOR
    from pytest_flashckpt.simulate.fake_ranks import simulate_rank

    from tensor_parallel_worker import BATCH, CARD, SEED, SEQ, card

    dp, tp, records = launched
    activation = BATCH // dp * SEQ * CARD["n_embd"] * 4  # one float32 (rows, seq, width) activation of this rank
    for strategy in _strategies(tp):
        name, _, wrapper = strategy.partition(":")
        sim = simulate_rank(card(), Layout(dp_shard=dp, tp=tp), batch_size=BATCH, seq_len=SEQ, strategy=name, seed=SEED,
                            compile=CompileConfig(scope="block", ac_wrapper=wrapper or "inside"),  # type: ignore[arg-type]
                            budget=0.5 if name == "compile_budget" else None)
        for record in records:
            real, where = record["strategies"][strategy]["memory"], (record["rank"], strategy)
            for key in ("fwd_bwd_start_bytes", "optimizer_start_bytes", "optimizer_peak_bytes"):
                assert sim[key] == real[key], (where, key, sim[key], real[key])
            gap = real["fwd_bwd_peak_bytes"] - sim["fwd_bwd_peak_bytes"]
            assert 0 <= gap <= GLOO_STAGING_FACTOR * activation + sim["largest_allgather_bytes"], (where, gap)
