"""Compiled context-parallel ranks (issue 32): on 4 gloo ranks, every block compiled with torch's ring attention
inside it, over cp alone, with FSDP, with tensor parallel (the checkpoint outside the compiled block) and with HSDP
replicas: no graph break, the eager rank's loss and gradients, and the scenario's own rank
(``distributed.rank.measure``) holding what its compiled twin simulated by the engine holds. The spike's
measurement (``benchmarks/spike_compiled_cp_ranks.py``, reports/spike-compiled-cp-ranks.md) kept as a check."""

from __future__ import annotations

import pytest
from benchmark_modules import import_benchmark


@pytest.mark.distributed
@pytest.mark.slow
def test_compiled_cp_ranks_train_as_eager_ones_and_hold_what_their_compiled_twin_holds() -> None:
    from pytest_flashckpt.compile_step import compiler_missing
    from pytest_flashckpt.models.anatomy import get_blocks
    from pytest_flashckpt.models.cards import build_model, load_card

    if compiler_missing():
        pytest.skip(compiler_missing())
    spike = import_benchmark("spike_compiled_cp_ranks")
    ranks = spike.measured_and_simulated()
    assert len(ranks) == spike.WORLD
    blocks = len(get_blocks(build_model(load_card("llama-tiny"), "sdpa", "meta")))
    exact: list[bool] = []
    for rank in ranks:
        for case, (*_, wrapper) in spike.CASES.items():
            where = (rank["rank"], case)
            record = rank["cases"][case]
            assert "error" not in record, (where, record.get("error"))
            # compiled as a whole: no graph break (the ring's backward broke it before distributed.context_parallel
            # called the CPU op positionally), every block's region run (twice with the checkpoint outside)
            assert record["first_step_breaks"] == 0, (where, record["break_reasons"])
            assert record["compiled_regions"] == blocks * (2 if wrapper == "outside" else 1) and record["recompiles"] == 0
            # the eager rank's step (fp32 sums in another order: measured within 3.2e-8)
            assert abs(record["compiled_loss"] - record["eager_loss"]) < 1e-5 and record["grad_max_abs_vs_eager"] < 1e-6, where
            simulated = record["simulated"]
            assert "error" not in simulated, (where, simulated.get("error"))
            # state and optimizer peak to the byte; the forward+backward peak (one measured step, not the lowest of
            # repeats) at or above the twin's by at most one all-gather (gloo's thread holding a finished
            # collective), and to the byte in at least half the cases: 18 of 20 in the report's run (the
            # others 215,936 B above, the all-gather 3,146,496 B), 15 of 20 in an earlier run on a loaded machine;
            # a misaccounting of the fake rank (the probe's double count of the ring's K/V before cb3a03e) is off in
            # every case
            assert simulated["state_bytes"] == record["state_bytes"], where
            assert simulated["optimizer_peak_bytes"] == record["optimizer_peak_bytes"], where
            gap = record["fwd_bwd_peak_bytes"] - simulated["fwd_bwd_peak_bytes"]
            assert 0 <= gap <= record["largest_allgather_bytes"], (where, gap, record["largest_allgather_bytes"])
            exact.append(gap == 0)
    assert sum(exact) * 2 >= len(exact), f"{sum(exact)} of {len(exact)} forward+backward peaks to the byte"
