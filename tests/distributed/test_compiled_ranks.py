"""Compiled ranks (issue 32 item 7): FSDP2 with each block compiled after the activation strategy and before
``fully_shard`` (torchtitan's order), in the distributed suite; what is refused before anything runs, with the
measured reason (``reports/spike-compiled-layouts.md``); the rank's record aggregated and shown. The launch itself
(~20 s with a cold compile on 2 cores) is ``slow``."""

from __future__ import annotations

import pytest

from pytest_flashckpt.config.axes import CompileConfig, LayoutMesh, NotBuiltYet
from pytest_flashckpt.core.registry import tensor_parallel_compiled_strategies, whole_block_strategies
from pytest_flashckpt.config.scenario import ActivationConfig, SaveConfig, Scenario
from pytest_flashckpt.config.layout import Layout
from pytest_flashckpt.config.suites import load_suite
from pytest_flashckpt.core.result import Result
from pytest_flashckpt.distributed.aggregate import aggregate
from pytest_flashckpt.report import distributed as report

BLOCK = CompileConfig(scope="block")


def _ranks(**kw) -> Scenario:
    return Scenario("s", **{"world_size": 2, "batch_size": 2, "seq_len": 64, "compile": BLOCK, **kw})


@pytest.mark.parametrize(("kw", "message"), [
    (dict(model="llama-tiny", layout=LayoutMesh(tp=2), activation=ActivationConfig("full")),
     r"layout.tp > 1 and activation.strategy full is not built: .*reports/spike-compiled-layouts.md.*selective_op"
     r".*compile.ac_wrapper: outside"),
    (dict(model="llama-tiny", layout=LayoutMesh(tp=2), activation=ActivationConfig("every_k", k=2)),
     r"layout.tp > 1 and activation.strategy every_k is not built"),
    (dict(model="llama-tiny", layout=LayoutMesh(tp=2), activation=ActivationConfig("selective_op"),
          compile=CompileConfig(scope="block", ac_wrapper="outside")),
     r"compile.ac_wrapper: outside with activation.strategy selective_op is not built .*full, every_k, offload"),
    (dict(compile=CompileConfig(scope="model")), r"compile.scope: 'model' .* world_size 2 is not built"),
    (dict(activation=ActivationConfig("budget", budget=0.5)), r"activation.strategy budget and world_size 2 is not built"),
    (dict(save=SaveConfig(strategy="dcp")), r"compile.scope with a checkpoint pass is not built yet"),
])
def test_what_compiled_ranks_cannot_be_is_refused_naming_the_key(kw, message) -> None:
    with pytest.raises(NotBuiltYet, match=message):
        _ranks(**kw)


def test_fsdp_ranks_compile_per_block_with_a_fixed_strategy_or_compile_budget() -> None:
    assert _ranks(activation=ActivationConfig("full")).compile == BLOCK
    assert _ranks(activation=ActivationConfig("compile_budget", budget=0.5)).compile == BLOCK
    compiled = [s for s in load_suite("distributed").scenarios if s.compile.enabled]
    assert [s.name for s in compiled] == ["fsdp2-full-compiled", "tp2-selective-compiled", "tp2-full-compiled-outside",
                                          "cp2-full-compiled", "pp2-full-compiled", "pp2xtp2-full-compiled-outside",
                                          "pp2xcp2-full-compiled"]
    assert all(s.save.strategy == "none" for s in compiled) and compiled[1].layout.tensor_parallel
    assert compiled[2].compile.ac_wrapper == "outside" and compiled[2].layout.tensor_parallel
    assert compiled[3].layout.cp == 2
    assert compiled[5].layout.pp == 2 and compiled[5].layout.tensor_parallel and compiled[5].world_size == 4
    assert compiled[6].layout.pp == 2 and compiled[6].layout.cp == 2 and compiled[6].world_size == 4


def test_the_registry_names_what_trains_compiled_under_tensor_parallel() -> None:
    # the strategies measured against one eager process in tests/distributed/test_compiled_tensor_parallel.py (the
    # checkpoint inside), and those that need it outside (reports/spike-compiled-layouts.md)
    assert tensor_parallel_compiled_strategies() == ("none", "selective_op", "compile_budget")
    assert whole_block_strategies() == ("full", "every_k")


@pytest.mark.parametrize("strategy", tensor_parallel_compiled_strategies())
def test_tensor_parallel_ranks_compile_with_what_trains_compiled(strategy) -> None:
    activation = ActivationConfig(strategy, budget=0.5) if strategy == "compile_budget" else ActivationConfig(strategy)
    for layout, world in ((LayoutMesh(tp=2), 2), (LayoutMesh(dp_shard=2, tp=2), 4)):
        scenario = _ranks(model="llama-tiny", layout=layout, activation=activation, world_size=world, batch_size=4)
        assert scenario.compile == BLOCK and scenario.layout.tensor_parallel


@pytest.mark.parametrize("strategy", whole_block_strategies())
def test_full_and_every_k_compile_under_tensor_parallel_with_the_checkpoint_outside(strategy) -> None:
    outside = CompileConfig(scope="block", ac_wrapper="outside")
    for layout, world in ((LayoutMesh(tp=2), 2), (LayoutMesh(dp_shard=2, tp=2), 4)):
        scenario = _ranks(model="llama-tiny", layout=layout, activation=ActivationConfig(strategy, k=2),
                          world_size=world, batch_size=4, compile=outside)
        assert scenario.compile.ac_wrapper == "outside" and scenario.layout.tensor_parallel


def test_the_checkpoint_outside_needs_per_block_compile_and_an_enabled_compile() -> None:
    with pytest.raises(ValueError, match=r"compile.ac_wrapper: outside .* compile.scope is 'model'; set compile.scope to block"):
        CompileConfig(scope="model", ac_wrapper="outside")
    with pytest.raises(ValueError, match=r"compile.ac_wrapper is set but compile.scope is 'none'"):
        CompileConfig(ac_wrapper="outside")


def _rank(rank: int, recompiles: int = 0) -> dict:
    return {"rank": rank, "world_size": 2, "status": "measured", "backend": "sdpa", "kernel": "sdpa-flash-cpu",
            "activation": "full", "layout": "dp_shard 2 x tp 1", "peak_bytes": 3000 + rank, "state_bytes": 1000,
            "peak_source": "allocator", "compile_time_s": 9.0 + rank, "compiled_regions": 4, "recompiles": recompiles,
            "step_time_s": [0.2, 0.3], "fwd_bwd_peak_bytes": 2800 + rank, "optimizer_peak_bytes": 2000,
            "largest_allgather_bytes": 500}


def test_a_compiled_rank_record_is_one_steps_allocator_peak_with_its_compile_facts(monkeypatch) -> None:
    result = Result("distributed", "c", "measured", _ranks(activation=ActivationConfig("full")), device="cpu x2 (gloo)")
    aggregate(result, [_rank(0), _rank(1, recompiles=2)])
    m = result.metrics
    assert m["peak_bytes"] == 3001 and m["compile_time_s"] == 10.0 and m["compiled_regions"] == 4 and m["recompiles"] == 2
    assert m["fwd_bwd_peak_bytes"] == 2801 and result.probe == "allocator"  # the probe's windows beside the row's peak
    assert any("recompiles" in note for note in result.notes)  # control beside: no note without recompiles
    quiet = Result("distributed", "c", "measured", _ranks(activation=ActivationConfig("full")))
    aggregate(quiet, [_rank(0), _rank(1)])
    assert not any("recompiles" in note for note in quiet.notes)
    # FSDP alone compiled is simulated by the engine (dp_shard 2 x tp 1, compiled under fake mode), against the probe
    calls = []

    def engine(*args):
        calls.append(args)
        return 2850, 1000, 2000  # peak, state at the step's start, optimizer peak

    monkeypatch.setattr(report, "_simulate_layout", engine)
    text = "\n".join(report.distributed_section([result]))
    assert "FSDP over 2, compiled per block" in text and "not simulated" not in text
    assert calls and all(args[7] == Layout(dp_shard=2, tp=1) and args[9] == BLOCK for args in calls)
    assert "equal to the byte (2 ranks)" in text and "+1.7%" in text  # (2850 - 2801) / 2801: the probe's peak


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("scenario", [s for s in load_suite("distributed").scenarios if s.compile.enabled], ids=lambda s: s.name)
def test_the_suites_compiled_scenarios_run_compiled_on_every_rank(scenario, tmp_path) -> None:
    from pytest_flashckpt.compile_step import compiler_missing
    from pytest_flashckpt.distributed.pipeline import stage_ranges
    from pytest_flashckpt.distributed.scenario_run import run_distributed
    from pytest_flashckpt.models.anatomy import get_blocks
    from pytest_flashckpt.models.cards import build_model, load_card

    if compiler_missing():
        pytest.skip(compiler_missing())
    result = run_distributed(scenario, "cpu", "cpu", tmp_path)
    assert result.status == "measured", (result.reason, result.notes[-1:])
    m = result.metrics
    blocks = len(get_blocks(build_model(load_card(scenario.card), "sdpa", "meta")))
    # every block ran compiled, no recompile; with the checkpoint outside (the suite's row: full) a block's region runs
    # in the forward and again in the recomputation; a pipeline rank runs its own stage's blocks once per microbatch
    per_block = 2 if scenario.compile.ac_wrapper == "outside" else 1
    assert scenario.compile.ac_wrapper == "inside" or scenario.activation.strategy == "full"
    pipeline = scenario.layout.pipeline_schedule() if scenario.layout.pp > 1 else None
    per_stage_rank = scenario.world_size // scenario.layout.pp  # ranks of one pipeline rank's stages (mesh pp, dp, tp)
    on_rank = ([len(r) * pipeline.microbatches for r in stage_ranges(blocks, scenario.layout.pp) for _ in range(per_stage_rank)]
               if pipeline is not None else [blocks] * scenario.world_size)
    assert result.per_rank["compiled_regions"] == [per_block * n for n in on_rank] and m["recompiles"] == 0
    assert m["compile_time_s"] > m["step_time_s"] and m["peak_bytes"] > m["state_bytes"] > 0
    assert result.probe == "allocator" and result.kernel == "sdpa-flash-cpu"
    # every compiled rank (FSDP alone and tensor parallel) is simulated by the engine compiled under fake mode; against
    # the rank probe run under compiled code on the gloo ranks, its state and optimizer peak equal to the byte
    simulated, why = report.simulated_rank_peak(result)
    assert why == "" and m["state_bytes"] < simulated, why
    assert report._exact_windows(result).startswith("equal to the byte"), report._exact_windows(result)
    # and each rank's probed peak is never under the simulated one (Inductor's buffers allocated where the probe sees
    # them: probes.compiled.inductor_buffers_dispatched), above it only by what gloo's thread holds of finished
    # collectives; a pipeline rank with neither tensor nor context parallel stages none, and equals it to the byte.
    # With cp, the ring's collectives on gloo stage up to one all-gather, as in test_compiled_cp_stages.py (there
    # 6 of 16 cases above the twin in the spike's runs; here rank 0 read 120,960 B above in one of two slow runs)
    records, _ = report.engine_ranks(result)
    probed = [max(w) for w in zip(result.per_rank["fwd_bwd_peak_bytes"], result.per_rank["optimizer_peak_bytes"])]
    for rank, (peak, (sim, _, _)) in enumerate(zip(probed, records)):
        assert peak >= sim, (rank, peak, sim)
        if scenario.layout.pp > 1 and not scenario.layout.tensor_parallel:
            bound = m["largest_allgather_bytes"] if scenario.layout.cp > 1 else 0  # the step's largest
            assert peak - sim <= bound, (rank, peak, sim, bound)


def test_compiled_pipeline_stages_are_built_with_tensor_parallel_inside_or_not() -> None:
    stages = _ranks(model="llama-tiny", layout=LayoutMesh(pp=2, microbatches=2), activation=ActivationConfig("full"))
    assert stages.compile.enabled and stages.layout.pp == 2
    # tensor parallel inside compiled stages (reports/spike-compiled-tp-stages.md): what compiles under tensor
    # parallel, as for a tensor-parallel rank alone
    inside = _ranks(model="llama-tiny", world_size=4, layout=LayoutMesh(tp=2, pp=2, microbatches=2),
                    activation=ActivationConfig("full"), compile=CompileConfig(scope="block", ac_wrapper="outside"))
    assert inside.parallel_layout.tp == 2 and inside.parallel_layout.pp == 2
    with pytest.raises(NotBuiltYet, match=r"layout.tp > 1 and activation.strategy full is not built"):
        _ranks(model="llama-tiny", world_size=4, layout=LayoutMesh(tp=2, pp=2, microbatches=2),
               activation=ActivationConfig("full"))
    with pytest.raises(NotBuiltYet, match=r"'model' .* world_size 2 is not built"):  # per model: not on ranks
        _ranks(model="llama-tiny", layout=LayoutMesh(pp=2, microbatches=2), compile=CompileConfig(scope="model"))


def test_a_compiled_pipeline_row_is_simulated_by_the_pipeline_engine_compiled(monkeypatch) -> None:
    scenario = _ranks(model="llama-tiny", layout=LayoutMesh(pp=2, microbatches=2), activation=ActivationConfig("full"))
    result = Result("distributed", "c", "measured", scenario, device="cpu x2 (gloo)", backend="sdpa")
    calls = []

    def stage(*args, rank, compile):
        calls.append((rank, compile))
        return 3000 + rank, 1000, 2000  # peak, state at the step's start, optimizer peak (by rank)

    monkeypatch.setattr(report, "_simulate_stage_rank", stage)
    simulated, why = report.simulated_rank_peak(result)
    assert why == "" and simulated == 3001 and [rank for rank, _ in calls] == [0, 1]
    assert all(compile == BLOCK for _, compile in calls)  # each stage compiled as the ranks compile it


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("strategy, ac_wrapper", [("none", "inside"), ("full", "outside")])
def test_compiled_pipeline_stages_run_compiled_on_every_rank(strategy, ac_wrapper, tmp_path) -> None:
    """pp 2 on 2 gloo ranks (1F1B, 2 microbatches), every block of each stage compiled before ``fully_shard``: each
    rank's blocks ran compiled once per microbatch (twice with the checkpoint outside: forward and recomputation),
    no recompile, the peak from the allocator over the rank's state, the rank probe's windows beside it, and each
    rank simulated compiled by the pipeline engine."""
    from pytest_flashckpt.compile_step import compiler_missing
    from pytest_flashckpt.distributed.scenario_run import run_distributed

    if compiler_missing():
        pytest.skip(compiler_missing())
    scenario = _ranks(model="llama-tiny", layout=LayoutMesh(pp=2, microbatches=2), rounds=2,
                      activation=ActivationConfig(strategy), compile=CompileConfig(scope="block", ac_wrapper=ac_wrapper))
    result = run_distributed(scenario, "cpu", "cpu", tmp_path)
    assert result.status == "measured", (result.reason, result.notes[-1:])
    m = result.metrics
    per_block = 2 if ac_wrapper == "outside" else 1
    blocks = [2, 1]  # llama-tiny's 3 blocks over 2 stages
    assert result.per_rank["compiled_regions"] == [per_block * n * 2 for n in blocks] and m["recompiles"] == 0
    assert result.probe == "allocator" and result.kernel == "sdpa-flash-cpu"
    assert m["peak_bytes"] > m["state_bytes"] > 0 and m["fwd_bwd_peak_bytes"] > 0
    assert m["compile_time_s"] > m["step_time_s"]
    # each rank's stages simulated compiled under fake mode (simulate.pipeline): against the rank probe run under
    # compiled code on the gloo ranks, the state and the optimizer peak equal to the byte on both ranks, and so is
    # each rank's peak: a pipeline rank stages no collective, and Inductor's buffers are allocated where the probe
    # sees them (probes.compiled.inductor_buffers_dispatched; without it the first rank's probe missed some)
    simulated, why = report.simulated_rank_peak(result)
    assert why == "" and simulated > m["state_bytes"], why
    assert report._exact_windows(result).startswith("equal to the byte"), report._exact_windows(result)
    records, _ = report.engine_ranks(result)
    probed = [max(w) for w in zip(result.per_rank["fwd_bwd_peak_bytes"], result.per_rank["optimizer_peak_bytes"])]
    assert probed == [peak for peak, _, _ in records]
