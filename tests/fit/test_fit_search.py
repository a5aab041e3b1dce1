"""The search: exact prune, simulations in time order and cached by their inputs, top / budget, closest miss; and
the command's one-line errors. A stand-in simulation keeps these fast; one test runs the real simulated rank."""

from __future__ import annotations

import re

from types import SimpleNamespace

import pytest

from pytest_flashckpt.cli import main
from pytest_flashckpt.config.model_card import load_card
from pytest_flashckpt.config.suites import load_suite
from pytest_flashckpt.fit import search as search_module
from pytest_flashckpt.fit.hardware import DEVICES
from pytest_flashckpt.fit.search import FitRequest, search

CARD = load_card("llama-tiny")
MiB = 2**20


def stand_in(calls: list):
    """A rank whose state is the even split and whose activations grow with the rank's tokens (no torch run)."""
    def simulate(card, layout, *, batch_size, seq_len, strategy, k, dtype, precision):
        calls.append((layout.dp_shard, layout.tp, batch_size, strategy, precision))
        state = card.num_params() * 12 // (layout.dp_shard * layout.tp)
        grads = card.num_params() * 4 // (layout.dp_shard * layout.tp)
        activations = batch_size // layout.dp_shard * seq_len * card.n_embd * 40 // layout.tp // (4 if strategy == "full" else 1)
        return {"peak_bytes": state + grads + activations, "fwd_bwd_start_bytes": state,
                "fwd_bwd_peak_bytes": state + activations, "optimizer_start_bytes": state + grads,
                "optimizer_peak_bytes": state + grads}
    return simulate


def request(**changes) -> FitRequest:
    base = dict(card=CARD, seq_len=256, global_batch_tokens=256 * 16, gpus=(4,), device=DEVICES["h100-sxm"],
                device_memory=40 * MiB, top=3, max_simulations=20)
    return FitRequest(**{**base, **changes})


def test_simulations_follow_the_time_ranking_are_cached_and_stop_at_top() -> None:
    calls: list = []
    (found,) = search(request(), simulate=stand_in(calls))
    assert len(found.fitting) == 3 and found.simulations == len(calls) == len(set(calls))
    tried = found.fitting + found.not_fitting
    assert all(r.memory.peak_bytes <= request().usable_bytes for r in found.fitting)
    steps = [r.time.step_s for r in sorted(tried, key=lambda r: r.time.step_s)]
    assert max(r.time.step_s for r in found.fitting) <= steps[-1]
    assert [r.time.step_s for r in found.fitting] == sorted(r.time.step_s for r in found.fitting)


def test_accumulation_adds_the_gradients_and_no_reshard_adds_the_unsharded_blocks() -> None:
    calls: list = []
    (found,) = search(request(top=50, max_simulations=50, device_memory=10**12), simulate=stand_in(calls))
    for r in found.fitting:
        c, m = r.candidate, r.memory
        assert m.added["accumulated gradients"] == (m.gradient_bytes if c.accumulation > 1 else 0)
        assert (m.added["unsharded block parameters"] > 0) == (not c.reshard_after_forward)
        assert ("modelled" in m.source) == any(m.added.values())


def test_the_state_prune_runs_no_simulation_and_names_the_closest(capsys) -> None:
    calls: list = []
    (found,) = search(request(device_memory=MiB), simulate=stand_in(calls))
    assert calls == [] and found.pruned_by_state == found.enumerated and found.closest_state is not None


TIGHT = -(-CARD.num_params() // 4) * 16 + 4096  # above the training state of 4 shards, below any step's peak


def never_fits(calls: list):
    """The stand-in rank with a forward+backward peak over any device (each step holds TIGHT more)."""
    simulate = stand_in(calls)

    def over(*args, **kwargs):
        record = simulate(*args, **kwargs)
        return {**record, "fwd_bwd_peak_bytes": record["fwd_bwd_peak_bytes"] + TIGHT, "peak_bytes": record["peak_bytes"] + TIGHT}
    return over


def test_the_simulation_budget_is_kept() -> None:
    calls: list = []
    (found,) = search(request(device_memory=TIGHT, margin=0.0, max_simulations=2), simulate=never_fits(calls))
    assert len(calls) == found.simulations == 2 and not found.fitting and found.closest() is not None


def test_the_budget_is_shared_over_the_strategies_so_a_slower_one_that_fits_is_found(monkeypatch) -> None:
    """The time model favours the strategies that recompute least; with the whole budget spent in time order the
    search could miss the one that fits (full checkpointing, for Llama-3-70B). Each strategy gets its share."""
    calls: list = []
    fits_only_full, over = stand_in(calls), never_fits(calls)

    def simulate(card, layout, **kw):
        return fits_only_full(card, layout, **kw) if kw["strategy"] == "full" else over(card, layout, **kw)

    class RecomputeIsSlow:  # every candidate of a strategy faster than any of the next one's, large microbatches first
        def __init__(self, *args) -> None:
            pass

        def step(self, c):
            return SimpleNamespace(step_s=("none", "selective_op", "full").index(c.strategy) * 100 + c.tp - c.microbatch / 100)

    monkeypatch.setattr(search_module, "StepTimeModel", RecomputeIsSlow)
    req = request(device_memory=TIGHT, margin=0.0, max_simulations=3, strategies=("none", "selective_op", "full"))
    (found,) = search(req, simulate=simulate)
    assert {call[3] for call in calls} == {"none", "selective_op", "full"} and found.simulations == 3
    assert found.chosen is not None and found.chosen.candidate.strategy == "full"


def _fit(*args: str) -> list[str]:
    return ["fit", "--model", "llama-tiny", "--seq", "256", "--global-batch-tokens", str(256 * 16), *args]


@pytest.mark.parametrize("args, message", [
    (["--gpus", "4", "--tp", "4"], "--tp 4: model card 'llama-tiny' has n_head 6, not divisible by 4"),
    (["--gpus", "4,64"], "--gpus 64: the global batch of 16 sequences"),  # refused before 4 GPUs simulate
    (["--gpus", "4", "--device", "tpu"], "--device tpu: unknown device"),
    (["--gpus", "4", "--device-memory", "1MiB"], "no layout fits 4 GPUs: even the training state alone exceeds"),
    (["--gpus", "4", "--strategies", "budget"], "--strategies 'budget': fit searches none, selective_op, every_k, full"),
    (["--gpus", "4", "--write-scenario", "x.txt"], "--write-scenario x.txt: name a .yaml file"),
    (["--gpus", "4", "--seq", "4096"], "--seq 4096: longer than model card 'llama-tiny'"),
])
def test_impossible_requests_are_one_line_errors_with_exit_status_2(args, message, capsys) -> None:
    assert main(_fit(*args)) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_no_layout_fits_names_the_closest_and_by_how_much(monkeypatch, capsys) -> None:
    monkeypatch.setattr(search_module, "simulate_rank", never_fits([]))
    assert main(_fit("--gpus", "4", "--device-memory", str(TIGHT), "--margin", "0", "--max-simulations", "3")) == 2
    err = capsys.readouterr().err
    # three simulations, the rest never tried: not "no layout fits" but the simulated ones, and how many are left
    assert "no layout simulated fits 4 GPUs: closest " in err and "per rank, short by " in err
    assert re.search(r"\((\d+) layouts left unsimulated: raise --max-simulations\)", err)
    monkeypatch.setattr(search_module, "simulate_rank", never_fits([]))
    assert main(_fit("--gpus", "4", "--pp", "1", "--device-memory", str(TIGHT), "--margin", "0",
                     "--max-simulations", "500")) == 2  # (--pp 1: the stand-in replaces the FSDP and TP rank only)
    err = capsys.readouterr().err  # with the budget to try every one: none fits
    assert "no layout fits 4 GPUs: closest " in err and "unsimulated" not in err


@pytest.mark.slow
def test_the_command_on_the_real_simulated_rank_writes_a_loadable_scenario(tmp_path, capsys) -> None:
    scenario, titan = tmp_path / "chosen.yaml", tmp_path / "chosen.toml"
    assert main(["fit", "--model", "llama-tiny", "--seq", "32", "--global-batch-tokens", str(32 * 4), "--gpus", "2",
                 "--tp", "1", "--pp", "1", "--strategies", "full", "--top", "1", "--max-simulations", "1",
                 "--device-memory", "64MiB", "--write-scenario", str(scenario), "--write-torchtitan", str(titan)]) == 0
    out = capsys.readouterr().out
    assert "margin of 10%" in out and "not measured yet" in out and "cp none (with FSDP over dp_shard x cp, tp and inside pipeline stages)" in out
    assert "| 1 | 2 | " in out and "(simulated" in out
    (loaded,) = load_suite(str(scenario)).scenarios
    assert loaded.simulate.world_size == 2 and loaded.seq_len == 32
    assert "data_parallel_shard_degree = 2" in titan.read_text(encoding="utf-8")


def test_every_layout_axis_has_a_memory_source_and_a_missing_one_is_refused(monkeypatch) -> None:
    from pytest_flashckpt.fit import memory as memory_module
    from pytest_flashckpt.fit.candidates import Candidate
    from pytest_flashckpt.fit.memory import AXIS_SOURCES, RankMemoryModel, unknown_axis

    flat = Candidate(gpus=4, dp_shard=2, tp=2, microbatch=1, accumulation=1, strategy="none", precision="mixed")
    assert set(AXIS_SOURCES) == {"dp_shard", "tp", "dp_replicate", "pp", "cp"}
    for axis in ({}, {"dp_replicate": 2}, {"pp": 2, "tp": 1}, {"cp": 2, "tp": 1, "dp_shard": 1}):
        assert unknown_axis(Candidate(**{**vars(flat), **axis})) is None
    # control: an axis whose source refuses is named before anything simulates
    monkeypatch.setitem(memory_module.AXIS_SOURCES, "cp", lambda c: f"cp {c.cp}: no source" if c.cp > 1 else None)
    with pytest.raises(ValueError, match="cp 2: no source"):
        RankMemoryModel(CARD, 256, lambda *a, **k: pytest.fail("simulated")).memory(Candidate(**{**vars(flat), "cp": 2}))


def test_hsdp_replicas_share_the_shard_groups_simulation_and_add_an_all_reduce() -> None:
    from pytest_flashckpt.fit.candidates import Candidate
    from pytest_flashckpt.fit.memory import RankMemoryModel
    from pytest_flashckpt.fit.time_model import StepTimeModel

    calls: list = []
    memory = RankMemoryModel(CARD, 256, stand_in(calls))
    fsdp = Candidate(gpus=8, dp_shard=8, tp=1, microbatch=1, accumulation=1, strategy="none", precision="mixed")
    hsdp = Candidate(**{**vars(fsdp), "gpus": 32, "dp_replicate": 4})
    assert memory.memory(fsdp) == memory.memory(hsdp) and len(calls) == 1
    times = StepTimeModel(CARD, 256, DEVICES["h100-sxm"])
    assert times.step(hsdp).fsdp_s > times.step(fsdp).fsdp_s


def test_a_torchtitan_toml_gives_the_defaults_the_command_line_leaves_unset(tmp_path) -> None:
    from argparse import Namespace

    from pytest_flashckpt.cli import build_parser
    from pytest_flashckpt.fit.command import request_from

    path = tmp_path / "job.toml"
    path.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nseq_len = 4096\nlocal_batch_size = 2\n'
                    '[parallelism]\ndata_parallel_shard_degree = 4\ntensor_parallel_degree = 2\n'
                    '[activation_checkpoint]\nmode = "full"\n', encoding="utf-8")
    args: Namespace = build_parser().parse_args(["fit", "--model", str(path)])
    _, req = request_from(args)
    assert (req.seq_len, req.global_batch_tokens, req.gpus, req.tp, req.strategies) == (4096, 2 * 4 * 4096, (8,), (2,), ("full",))
    args = build_parser().parse_args(["fit", "--model", str(path), "--seq", "2048", "--strategies", "none", "--gpus", "16"])
    _, req = request_from(args)
    assert (req.seq_len, req.gpus, req.strategies) == (2048, (16,), ("none",))


def test_the_unsharded_blocks_of_no_reshard_are_part_of_the_exact_prune() -> None:
    calls: list = []
    (found,) = search(request(device_memory=TIGHT, margin=0.0, max_simulations=50, top=50), simulate=stand_in(calls))
    tried = [r.candidate for r in found.fitting + found.not_fitting]
    assert tried and all(c.reshard_after_forward for c in tried)  # without it, the blocks alone exceed TIGHT
    assert found.pruned_by_state > 0


def test_a_candidate_holding_no_less_than_a_miss_is_not_simulated_and_the_answer_is_unchanged(monkeypatch) -> None:
    """The dominance prune (search.holds_at_least) only skips candidates whose peak cannot be lower than a simulated
    miss's: the fitting layouts are the same as without it, found with fewer simulations. The time model is replaced
    by one that tries small microbatches first (as the real one did for Llama-3-70B on 8 GPUs), where the prune bites."""

    class SmallFirst:
        def __init__(self, *args) -> None:
            pass

        def step(self, c):
            return SimpleNamespace(step_s=c.microbatch + c.tp / 100 + (0.5 if c.strategy == "full" else 0.0))

    monkeypatch.setattr(search_module, "StepTimeModel", SmallFirst)
    memory = TIGHT + MiB // 2  # the smallest microbatch of some ranks does not fit
    calls: list = []
    (pruned,) = search(request(device_memory=memory, margin=0.0, max_simulations=200, top=5), simulate=stand_in(calls))
    assert pruned.pruned_by_dominance > 0
    misses = [r.candidate for r in pruned.not_fitting if r.memory is not None]
    simulated = {(c[0], c[1], c[2], c[3], c[4]) for c in calls}
    assert len(simulated) == pruned.simulations
    with monkeypatch.context() as patch:
        patch.setattr(search_module, "holds_at_least", lambda c, over: False)  # control: no prune
        every: list = []
        (plain,) = search(request(device_memory=memory, margin=0.0, max_simulations=200, top=5), simulate=stand_in(every))
    assert [r.candidate for r in plain.fitting] == [r.candidate for r in pruned.fitting]
    assert plain.pruned_by_dominance == 0 and plain.simulations > pruned.simulations
    skipped = [r.candidate for r in plain.not_fitting if r.memory is not None and r.candidate not in misses]
    assert skipped and all(any(search_module.holds_at_least(c, m) for m in misses) for c in skipped)


def _fits_only_at_tp2(calls: list):
    """The stand-in rank, over any device at tp 1 (as 405B on 64 GPUs is below tp 4 or a pipeline; llama-tiny's
    two KV heads allow tp 1 and 2)."""
    simulate = stand_in(calls)

    def at_tp4(card, layout, **kwargs):
        out = simulate(card, layout, **kwargs)
        return out if layout.tp >= 2 else {key: value + 10**12 for key, value in out.items()}
    return at_tp4


def test_a_miss_tries_its_ranks_least_holding_layout_next_so_the_budget_reaches_other_ranks(monkeypatch) -> None:
    """After a miss the search simulates the least-holding members of that rank (smallest microbatch, resharded):
    when they miss too, dominance prunes the rank and the budget moves to the next tp (3 simulations here, of 20 layouts). Control: without the jump
    (time order alone) the same budget goes on microbatch after microbatch of the ranks that never fit."""
    budget = dict(max_simulations=3, top=1, global_batch_tokens=256 * 64, strategies=("full",), precisions=("pure",))
    calls: list = []
    (found,) = search(request(**budget), simulate=_fits_only_at_tp2(calls))
    assert [r.candidate.tp for r in found.fitting] == [2], [(c[1], c[2]) for c in calls]
    assert found.pruned_by_dominance > 0

    monkeypatch.setattr(search_module, "_least_holding", lambda pairs: [])
    calls = []
    (old,) = search(request(**budget), simulate=_fits_only_at_tp2(calls))
    assert old.fitting == [] and {c[1] for c in calls} == {1}


def test_mixed_holds_at_least_pure_at_the_same_layout_and_not_the_reverse() -> None:
    """A pure bf16 miss rules out mixed at the same layout (fp32 master state, 16 B against 8 B a parameter), never
    the other way round."""
    from dataclasses import replace

    from pytest_flashckpt.fit.search import holds_at_least

    calls: list = []
    (found,) = search(request(top=50, max_simulations=50, device_memory=10**12), simulate=stand_in(calls))
    pure = next(r.candidate for r in found.fitting if r.candidate.precision == "mixed")
    pure = replace(pure, precision="pure")
    mixed = replace(pure, precision="mixed")
    assert holds_at_least(mixed, pure) and not holds_at_least(pure, mixed)
