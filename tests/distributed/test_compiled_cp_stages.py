"""Compiled pipeline stages with context parallel inside (issue 32): on 4 gloo ranks (``pp 2 x cp 2``), every block
of each stage compiled with torch's ring attention inside it, over 1F1B and GPipe and three strategies: no graph
break, one process's loss and gradients, and the scenario's own rank (``distributed.rank.measure``) holding what
its stage rank simulated compiled by the engine holds. The spike's measurement
(``benchmarks/spike_compiled_cp_stages.py``, reports/spike-compiled-cp-stages.md) kept as a check."""

from __future__ import annotations

import pytest
from benchmark_modules import import_benchmark


@pytest.mark.distributed
@pytest.mark.slow
def test_compiled_cp_stages_train_as_one_process_and_hold_what_their_compiled_twin_holds() -> None:
    from pytest_flashckpt.compile_step import compiler_missing
    from pytest_flashckpt.distributed.pipeline import stage_ranges
    from pytest_flashckpt.models.cards import load_card

    if compiler_missing():
        pytest.skip(compiler_missing())
    spike = import_benchmark("spike_compiled_cp_stages")
    ranks = spike.measured_and_simulated()
    assert len(ranks) == spike.WORLD
    blocks_of_stage = [len(r) for r in stage_ranges(load_card("llama-tiny").n_layer, 2)]
    exact: list[bool] = []
    for rank in ranks:
        for case, (_, microbatches, _) in spike.CASES.items():
            where = (rank["rank"], case)
            record = rank["cases"][case]
            assert "error" not in record, (where, record.get("error"))
            compiled, eager = record["compiled"], record["eager"]
            # compiled as a whole: no graph break, each block of the rank's stage run once per microbatch
            assert compiled["breaks"] == 0, (where, compiled["break_reasons"])
            assert record["compiled_regions"] == blocks_of_stage[rank["rank"] // 2] * microbatches, where
            assert record["recompiles"] == 0, where
            # one process on the whole batch and sequence (fp32 sums in another order), compiled and eager alike
            for step in (compiled, eager):
                assert abs(step["loss"] - record["reference_loss"]) < 1e-5 and step["grad_max_abs"] < 1e-6, (where, step)
            # state and optimizer peak to the byte; the forward+backward peak (one measured step) at or above the
            # twin's by at most one all-gather: gloo's thread holding a finished collective, and gloo's reduce-scatter
            # copying its input (a stage group's padded gradients, that group's all-gather size in fp32) into a
            # buffer of its own, where full's peak falls on the first stage (the spike's docstring: 6 of 16 cases
            # in every run, 467,584 B at most); NCCL has neither
            simulated = record["simulated"]
            assert "error" not in simulated, (where, simulated.get("error"))
            assert simulated["state_bytes"] == record["state_bytes"], where
            assert simulated["optimizer_peak_bytes"] == record["optimizer_peak_bytes"], where
            gap = record["fwd_bwd_peak_bytes"] - simulated["fwd_bwd_peak_bytes"]
            assert 0 <= gap <= record["largest_allgather_bytes"], (where, gap, record["largest_allgather_bytes"])
            exact.append(gap == 0)
    # to the byte wherever gloo adds nothing (10 of 16 can be: 9 and 10 in the spike's runs); a quarter kept, for
    # gloo's thread on a loaded machine. A fake rank short of a buffer in every case fails here (the missing
    # wait_tensor of a compiled block left 10 of 16 equal and moved none: that check is the spike's, op by op)
    assert sum(exact) * 4 >= len(exact), f"{sum(exact)} of {len(exact)} forward+backward peaks to the byte"
