"""``layout: {dp_shard, tp}`` as a scenario axis (issue 32 item 1, docs/layouts.md): what a scenario may ask for,
refused before anything runs where it cannot be built, its fingerprint, and how the report shows a layout row.
The runs themselves (gloo ranks, a few seconds each) are in ``test_layout_runs.py``."""

from __future__ import annotations

import textwrap

import pytest

from pytest_flashckpt.config.axes import CompileConfig, LayoutMesh, NotBuiltYet
from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.fingerprint import fingerprint, fingerprinted
from pytest_flashckpt.config.scenario import (
    MEASURED_PIPELINE_STRATEGIES,
    ActivationConfig,
    ModelSpec,
    SaveConfig,
    Scenario,
    SimulateConfig,
)
from pytest_flashckpt.core.result import Result
from pytest_flashckpt.distributed.aggregate import aggregate
from pytest_flashckpt.report import distributed as report
from pytest_flashckpt.runner.suite import load_checked_suite

DCP = SaveConfig(strategy="dcp")


def _scenario(**kw) -> Scenario:
    base = dict(model="llama-tiny", world_size=2, batch_size=2, seq_len=64, save=DCP)
    return Scenario("s", **{**base, **kw})


@pytest.mark.parametrize(("kw", "message"), [
    (dict(world_size=1, save=SaveConfig()), "needs ranks: set world_size to dp_shard x tp"),
    (dict(world_size=3, batch_size=3), "layout.tp 2 does not divide world_size 3"),
    (dict(world_size=4, batch_size=4, layout=LayoutMesh(dp_shard=3, tp=2)), "layout.dp_shard 3 x tp 2 = 6 ranks, but world_size is 4"),
    (dict(world_size=4, batch_size=3, layout=LayoutMesh(dp_shard=2, tp=2)), "batch_size 3 must be divisible by layout.dp_shard 2"),
    (dict(model=ModelSpec(hf={"model_type": "llama"})), r"a layout \(tp, pp, cp\) with model.hf is not built"),
])
def test_a_layout_the_ranks_cannot_hold_is_refused_naming_the_key(kw, message) -> None:
    kw.setdefault("layout", LayoutMesh(tp=2))
    with pytest.raises(ValueError, match=message):
        _scenario(**kw)


@pytest.mark.parametrize(("kw", "message"), [
    (dict(save=SaveConfig(), activation=ActivationConfig("budget", budget=0.5)),
     r"layout.pp 2 with activation.strategy budget: pipeline stages run none, full, every_k, selective_op"),
    (dict(save=SaveConfig(), compile=CompileConfig(scope="block"), world_size=4, layout=LayoutMesh(tp=2, pp=2),
          activation=ActivationConfig("full")),  # tensor parallel inside compiled stages: what compiles under tp
     r"compile.scope: 'block' with layout.tp > 1 and activation.strategy full is not built"),
    (dict(save=DCP, compile=CompileConfig(scope="block")), r"compile.scope with a checkpoint pass is not built yet"),
])
def test_what_measured_pipeline_stages_cannot_be_is_refused_naming_the_key(kw, message) -> None:
    kw = {"world_size": 2, "layout": LayoutMesh(pp=2), **kw}
    with pytest.raises(NotBuiltYet, match=message):
        _scenario(**kw)


def test_measured_pipeline_stages_run_eager_with_or_without_sharded_saves() -> None:
    for strategy in MEASURED_PIPELINE_STRATEGIES:
        for save in (SaveConfig(), DCP):
            scenario = _scenario(world_size=2, batch_size=4, layout=LayoutMesh(pp=2, microbatches=4), save=save,
                                 activation=ActivationConfig(strategy))
            assert scenario.parallel_layout.describe() == "dp_shard 1 x tp 1 x pp 2"
    with pytest.raises(ValueError, match="sharded saves use checkpoint.strategy dcp"):
        _scenario(world_size=2, batch_size=4, layout=LayoutMesh(pp=2), save=SaveConfig(strategy="sync"))
    with pytest.raises(ValueError, match="3 microbatches do not divide the batch of a data-parallel rank"):
        _scenario(world_size=2, batch_size=4, layout=LayoutMesh(pp=2, microbatches=3), save=SaveConfig())


def test_hsdp_replicas_are_a_layout_axis_with_every_other_axis() -> None:
    hsdp = _scenario(world_size=4, batch_size=4, layout=LayoutMesh(dp_replicate=2))
    assert hsdp.parallel_layout.describe() == "dp_replicate 2 x dp_shard 2 x tp 1"
    with_tp = _scenario(world_size=8, batch_size=4, layout=LayoutMesh(dp_replicate=2, tp=2))
    assert with_tp.parallel_layout.describe() == "dp_replicate 2 x dp_shard 2 x tp 2"
    with pytest.raises(ValueError, match=r"batch_size 2 must be divisible by layout.dp_replicate x dp_shard 4"):
        _scenario(world_size=8, batch_size=2, layout=LayoutMesh(dp_replicate=2, tp=2))
    # with pipeline stages (FSDP2 over each stage's (dp_replicate, dp_shard)) and with context parallel (over
    # (dp_replicate, dp_shard_cp)): the microbatches divide a replica's rows, the sequence the ring's chunks
    stages = _scenario(world_size=4, batch_size=4, layout=LayoutMesh(dp_replicate=2, pp=2, microbatches=2),
                       save=SaveConfig())
    assert stages.parallel_layout.describe() == "dp_replicate 2 x dp_shard 1 x tp 1 x pp 2"
    with pytest.raises(ValueError, match=r"4 microbatches do not divide the batch of a data-parallel rank \(2 rows = "
                                         r"batch 4 / dp_replicate 2 x dp_shard 1\)"):
        _scenario(world_size=4, batch_size=4, layout=LayoutMesh(dp_replicate=2, pp=2, microbatches=4), save=SaveConfig())
    ring = _scenario(world_size=4, batch_size=4, layout=LayoutMesh(dp_replicate=2, cp=2))
    assert ring.parallel_layout.describe() == "dp_replicate 2 x dp_shard 1 x tp 1 x cp 2"
    with pytest.raises(ValueError, match=r"layout.dp_shard 2 x tp 1 x cp 2 x dp_replicate 2 = 8 ranks, but world_size is 4"):
        _scenario(world_size=4, batch_size=4, layout=LayoutMesh(dp_replicate=2, cp=2, dp_shard=2))
    with pytest.raises(ValueError, match=r"layout.dp_shard 1 x tp 1 x dp_replicate 2 = 2 ranks, but world_size is 4"):
        _scenario(world_size=4, batch_size=4, layout=LayoutMesh(dp_replicate=2, dp_shard=1))
    # at its default the new key changes no fingerprint: a tensor-parallel baseline stays comparable
    tp2 = _scenario(layout=LayoutMesh(tp=2))
    assert "layout.dp_replicate" not in fingerprinted(tp2)
    assert "layout.dp_replicate" in fingerprinted(hsdp)


def test_context_parallel_runs_on_measured_ranks_eager_or_compiled_and_refuses_the_rest() -> None:
    alone = _scenario(layout=LayoutMesh(cp=2))
    assert alone.parallel_layout.describe() == "dp_shard 1 x tp 1 x cp 2"
    both = _scenario(world_size=8, batch_size=4, layout=LayoutMesh(cp=2, tp=2))
    assert both.parallel_layout.describe() == "dp_shard 2 x tp 2 x cp 2"
    compiled = _scenario(layout=LayoutMesh(cp=2), compile=CompileConfig(scope="block"), save=SaveConfig())
    assert compiled.compile.enabled and compiled.parallel_layout.cp == 2  # (reports/spike-compiled-cp-ranks.md)
    with pytest.raises(NotBuiltYet, match=r"layout.tp > 1 and activation.strategy full is not built"):  # as under tp
        _scenario(world_size=4, batch_size=4, layout=LayoutMesh(cp=2, tp=2), activation=ActivationConfig("full"),
                  compile=CompileConfig(scope="block"), save=SaveConfig())
    # inside pipeline stages (each stage's blocks run the ring), eager or compiled (reports/spike-compiled-cp-stages.md)
    staged = _scenario(world_size=4, batch_size=4, layout=LayoutMesh(cp=2, pp=2, microbatches=2), save=SaveConfig())
    assert staged.parallel_layout.describe() == "dp_shard 1 x tp 1 x pp 2 x cp 2"
    compiled_stages = _scenario(world_size=4, batch_size=4, layout=LayoutMesh(cp=2, pp=2, microbatches=2),
                                save=SaveConfig(), activation=ActivationConfig("full"), compile=CompileConfig(scope="block"))
    assert compiled_stages.compile.enabled and compiled_stages.parallel_layout == staged.parallel_layout
    with pytest.raises(NotBuiltYet, match=r"compile.scope with a checkpoint pass is not built yet"):  # as every compiled rank
        _scenario(world_size=4, batch_size=4, layout=LayoutMesh(cp=2, pp=2, microbatches=2), save=DCP,
                  activation=ActivationConfig("full"), compile=CompileConfig(scope="block"))
    with pytest.raises(ValueError, match=r"layout.dp_shard 1 x tp 1 x cp 2 = 2 ranks, but world_size is 4"):
        _scenario(world_size=4, batch_size=4, layout=LayoutMesh(cp=2, dp_shard=1))
    with pytest.raises(ValueError, match=r"seq_len 66: layout cp 2: sequence 66 is not divisible by 2 x cp = 4"):
        _scenario(seq_len=66, layout=LayoutMesh(cp=2))
    with pytest.raises(ValueError, match=r"attention eager with layout.cp 2: torch's ring attention runs the flash op"):
        _scenario(attention="eager", layout=LayoutMesh(cp=2))
    with pytest.raises(ValueError, match=r"layout.tp 2 x cp 2 does not divide world_size 2"):
        _scenario(layout=LayoutMesh(cp=2, tp=2))
    simulated = Scenario("s", model="llama-tiny", batch_size=4, seq_len=64, layout=LayoutMesh(pp=2, microbatches=2),
                         simulate=SimulateConfig(enabled=True, world_size=4))
    assert simulated.parallel_layout.describe() == "dp_shard 2 x tp 1 x pp 2"
    with pytest.raises(ValueError, match="layout.tp must be a positive number of ranks, got 0"):
        LayoutMesh(tp=0)


@pytest.mark.parametrize(("layout", "kw", "message"), [
    (dict(schedule="gpipe"), {}, "layout.schedule applies to pipeline stages: set layout.pp above 1"),
    (dict(pp=2, schedule="zero_bubble"), {}, "pipeline schedule 'zero_bubble' is unknown; use one of gpipe, 1f1b"),
    (dict(pp=2, stages_per_rank=2), {}, "schedule 1f1b runs one stage per rank"),
    (dict(pp=2, microbatches=3), {}, "3 microbatches do not divide the batch of a data-parallel rank \\(2 rows"),
    (dict(pp=2, microbatches=1), {}, "schedule 1f1b needs at least one microbatch per stage \\(2\\)"),
    (dict(pp=2), dict(world_size=1), "layout \\(2 pipeline stages\\) needs ranks: set simulate.world_size"),
    (dict(pp=3), {}, "layout.tp 1 x pp 3 does not divide world_size 4"),
])
def test_a_pipeline_layout_the_batch_or_ranks_cannot_hold_is_refused_naming_the_key(layout, kw, message) -> None:
    simulate = SimulateConfig(enabled=True, world_size=kw.get("world_size", 4))
    with pytest.raises(ValueError, match=message):
        Scenario("s", model="llama-tiny", batch_size=4, seq_len=64, layout=LayoutMesh(**layout), simulate=simulate)


def test_pipeline_keys_enter_the_fingerprint_only_with_stages() -> None:
    simulate = SimulateConfig(enabled=True, world_size=4)
    tp = _scenario(layout=LayoutMesh(tp=2))
    assert not any(key.startswith(("layout.schedule", "layout.microbatches", "layout.stages_per_rank"))
                   for key in fingerprinted(tp))  # a tensor-parallel baseline stays comparable
    one = Scenario("s", model="llama-tiny", batch_size=8, seq_len=64, layout=LayoutMesh(pp=2), simulate=simulate)
    more = Scenario("s", model="llama-tiny", batch_size=8, seq_len=64, layout=LayoutMesh(pp=2, microbatches=4),
                    simulate=simulate)
    assert fingerprint(one) != fingerprint(more) and fingerprinted(one)["layout.schedule"] == "1f1b"


def test_a_tensor_parallel_layout_enters_the_fingerprint_and_fsdp_written_out_does_not() -> None:
    fsdp = Scenario("s", world_size=2, batch_size=2, save=DCP)
    written = Scenario("s", world_size=2, batch_size=2, save=DCP, layout=LayoutMesh(dp_shard=2, tp=1))
    assert written.layout == LayoutMesh() and fingerprint(written) == fingerprint(fsdp)
    tp = _scenario(layout=LayoutMesh(tp=2))
    assert fingerprint(tp) != fingerprint(_scenario())  # control: the layout is part of what was measured
    assert tp.reference().layout == tp.layout  # the reference runs the same layout, without checkpointing
    assert _scenario(world_size=2, batch_size=1, layout=LayoutMesh(tp=2)).batch_size == 1  # tp ranks share rows


def _suite(tmp_path, monkeypatch, body: str) -> str:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "suites").mkdir(exist_ok=True)
    (tmp_path / "suites" / "x.yaml").write_text(textwrap.dedent(f"""\
        name: x
        defaults: {{world_size: 2, batch_size: 2, seq_len: 64, measure: [memory]}}
        scenarios:
          {body}
        """), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_checked_suite("suites/x.yaml")
    return str(info.value)


def test_a_family_or_card_tensor_parallel_cannot_split_is_refused_before_anything_runs(tmp_path, monkeypatch) -> None:
    gpt = _suite(tmp_path, monkeypatch, "- {name: g, model: tiny, layout: {tp: 2}}")
    assert gpt.startswith("suites/x.yaml: scenario 'g': layout.tp: tensor parallel: the gpt block's fused q/k/v")
    heads = _suite(tmp_path, monkeypatch, "- {name: h, model: llama-tiny, world_size: 4, batch_size: 4, layout: {tp: 4}}")
    assert heads.startswith("suites/x.yaml: scenario 'h': layout.tp: 4: model card 'llama-tiny' has n_head 6, not divisible")
    assert "choose a tp that divides 6" in heads
    # control: the same card at a tp that divides its heads loads
    (tmp_path / "suites" / "x.yaml").write_text("name: x\nscenarios:\n  - {name: ok, model: llama-tiny, world_size: 2, "
                                                "batch_size: 2, seq_len: 64, measure: [memory], layout: {tp: 2}}\n")
    assert load_checked_suite("suites/x.yaml").scenarios[0].layout.tp == 2


def _rank(rank: int, state: int, optimizer: int) -> dict:
    return {"rank": rank, "world_size": 2, "status": "measured", "backend": "sdpa", "kernel": "flash", "activation": "none",
            "layout": "dp_shard 1 x tp 2", "peak_bytes": 1000, "fwd_bwd_peak_bytes": 1000, "optimizer_peak_bytes": optimizer,
            "state_bytes": state, "fwd_bwd_start_bytes": state, "optimizer_start_bytes": state, "largest_allgather_bytes": 0}


def test_the_report_shows_the_layout_and_the_engine_rank_against_every_measured_rank(monkeypatch) -> None:
    result = Result("distributed", "tp", "measured", _scenario(layout=LayoutMesh(tp=2)), device="cpu x2 (gloo)")
    aggregate(result, [_rank(0, 600, 800), _rank(1, 600, 800)])
    assert "layout: dp_shard 1 x tp 2" in result.notes
    monkeypatch.setattr(report, "_simulate_layout", lambda *a: (990, 600, 800))
    table = "\n".join(report.distributed_section([result]))
    assert "| dp_shard 1 x tp 2 " in table
    assert "equal to the byte (2 ranks)" in table and "-1.0%" in table
    monkeypatch.setattr(report, "_simulate_layout", lambda *a: (990, 592, 800))  # control: 8 B off at the start
    assert "+8 B / +0 B (measured - simulated)" in "\n".join(report.distributed_section([result]))
    fsdp = Result("distributed", "f", "measured", Scenario("f", world_size=2, batch_size=2, seq_len=64, save=DCP))
    assert report._layout(fsdp) == "FSDP over 2" and report._exact_windows(fsdp) == "—"


def test_a_simulated_layout_the_engine_cannot_run_is_refused_not_modelled_as_fsdp(tmp_path, monkeypatch) -> None:
    body = "- {name: e, model: llama-tiny, world_size: 1, batch_size: 4, layout: {tp: 2}, simulate: {enabled: true, world_size: 4, kernel: eager}}"
    message = _suite(tmp_path, monkeypatch, body)
    assert message.startswith("suites/x.yaml: scenario 'e': layout.tp: simulate.kernel eager / target cuda: the engine's rank")
    assert "a tensor-parallel layout is simulated only by the engine" in message and "set layout.tp to 1" in message
    # control: the engine's kernel loads, with the batch split over dp_shard 2 only (not the 4 ranks)
    (tmp_path / "suites" / "x.yaml").write_text("name: x\nscenarios:\n  - {name: ok, model: llama-tiny, batch_size: 2, "
                                                "layout: {tp: 2}, simulate: {enabled: true, world_size: 4}}\n")
    assert load_checked_suite("suites/x.yaml").scenarios[0].layout.ranks(4) == (2, 2)


@pytest.mark.slow
def test_a_simulated_layout_scenario_is_the_engines_rank_of_that_layout(tmp_path) -> None:
    """What ``flashckpt fit --write-scenario`` writes for a tensor-parallel layout runs in the simulate suite as
    that layout's rank (the engine under fake mode), not as an FSDP rank of all the ranks (~3 s per layout)."""
    from pytest_flashckpt.config.layout import Layout
    from pytest_flashckpt.models.cards import load_card
    from pytest_flashckpt.simulate.fake_ranks import simulate_rank
    from pytest_flashckpt.simulate.layouts import CUDA_ADAMW_FOREACH
    from pytest_flashckpt.simulate.scenario import run_simulated

    scenario = Scenario("s", model="llama-tiny", batch_size=4, seq_len=64, layout=LayoutMesh(tp=2),
                        simulate=SimulateConfig(enabled=True, world_size=4))
    result = Result("simulate", "s", "measured", scenario)
    run_simulated(scenario, result)
    card = load_card("llama-tiny")
    expected = {l: simulate_rank(card, l, batch_size=4, seq_len=64, foreach=CUDA_ADAMW_FOREACH)["peak_bytes"]
                for l in (Layout(dp_shard=2, tp=2), Layout(dp_shard=4, tp=1))}
    assert result.metrics["simulated_peak_bytes"] == expected[Layout(dp_shard=2, tp=2)]
    assert expected[Layout(dp_shard=2, tp=2)] != expected[Layout(dp_shard=4, tp=1)]  # control: the layouts differ
    assert "dp_shard 2 x tp 2" in result.notes[-1]


def test_the_will_it_fit_row_names_a_simulated_layout_and_does_not_invent_a_breakdown() -> None:
    from pytest_flashckpt.report.simulation import _row

    scenario = Scenario("s", model="llama-tiny", batch_size=4, seq_len=64, layout=LayoutMesh(tp=2),
                        simulate=SimulateConfig(enabled=True, world_size=8))
    result = Result("simulate", "s", "measured", scenario, device="meta")
    result.metrics.update(simulated_peak_bytes=2**30)
    row = _row(result)
    assert row[5] == "8 (dp_shard 4 x tp 2)" and row[7] == "—"  # the engine's rank: no category split
    result.metrics.update(simulated_parameters_bytes=2**29, simulated_activations_bytes=2**28)  # control: a split
    assert _row(result)[7] == "512.0 MiB / 256.0 MiB / 0.0 MiB"


def test_the_will_it_fit_row_names_the_pipeline_schedule_of_a_staged_layout() -> None:
    from pytest_flashckpt.report.simulation import _row

    scenario = Scenario("s", model="llama-tiny", batch_size=8, seq_len=64, layout=LayoutMesh(pp=2, microbatches=4),
                        simulate=SimulateConfig(enabled=True, world_size=4))
    result = Result("simulate", "s", "measured", scenario, device="meta")
    result.metrics.update(simulated_peak_bytes=2**30)
    assert _row(result)[5] == "4 (dp_shard 2 x tp 1 x pp 2, 1f1b, 4 microbatches)"


def test_measured_stages_the_card_cannot_split_are_refused_before_anything_runs(tmp_path, monkeypatch) -> None:
    text = _suite(tmp_path, monkeypatch, "- {name: p, model: llama-tiny, world_size: 4, batch_size: 4, "
                                         "layout: {pp: 4}}")
    assert text.startswith("suites/x.yaml: scenario 'p': layout.pp:") and "3 blocks" in text, text


def _stage_rank(rank: int, activation: str) -> dict:
    return {"rank": rank, "world_size": 2, "status": "measured", "backend": "sdpa", "kernel": "sdpa-flash-cpu",
            "activation": activation, "layout": "dp_shard 1 x tp 1 x pp 2, 1f1b over 4 microbatches",
            "peak_bytes": 900 - rank, "state_bytes": 500 - rank, "fwd_bwd_peak_bytes": 900 - rank,
            "optimizer_peak_bytes": 700 - rank, "largest_allgather_bytes": 0, "step_time_s": [0.2, 0.3]}


def test_a_pipeline_row_shows_each_rank_beside_its_own_simulated_stage(monkeypatch) -> None:
    scenario = _scenario(batch_size=4, layout=LayoutMesh(pp=2, microbatches=4), save=SaveConfig())
    result = Result("distributed", "p", "measured", scenario, device="cpu x2 (gloo)", backend="sdpa")
    aggregate(result, [_stage_rank(0, "stage 0: none"), _stage_rank(1, "stage 1: none")])
    assert result.notes[0] == "activation: rank 0: stage 0: none; rank 1: stage 1: none"
    simulated = {0: (900, 500, 700), 1: (899, 499, 699)}  # what the engine would simulate for each rank's stages
    monkeypatch.setattr(report, "_simulate_stage_rank", lambda *args, rank, compile: simulated[rank])
    text = "\n".join(report.distributed_section([result]))
    assert "dp_shard 1 x tp 1 x pp 2, 1f1b over 4 microbatches" in text and "equal to the byte (2 ranks)" in text
    simulated[1] = (899, 498, 699)  # control: rank 1's state off by a byte is shown, not hidden
    assert "+1 B / +0 B (measured - simulated)" in "\n".join(report.distributed_section([result]))
