"""Context parallel in ``flashckpt fit``: cp groups (alone, pure bf16) replicated over the GPUs, their memory from
``simulate.context_parallel`` labelled modelled, the ring's K/V exchange in the time model, and the errors."""

from __future__ import annotations

import pytest

from pytest_flashckpt.cli import main
from pytest_flashckpt.config.errors import InputError
from pytest_flashckpt.config.model_card import load_card
from pytest_flashckpt.fit.candidates import Candidate, cp_degrees, enumerate_candidates
from pytest_flashckpt.fit.hardware import DEVICES
from pytest_flashckpt.fit.memory import RankMemoryModel
from pytest_flashckpt.fit.search import FitRequest, search
from pytest_flashckpt.fit.time_model import StepTimeModel

CARD = load_card("llama-tiny")
SMALL = load_card("llama3.2-1b")


def context_stand_in(calls: list, phase: str = "backward"):
    def simulate(card, layout, *, batch_size, seq_len, dtype, strategy, k):
        calls.append((layout.cp, batch_size, seq_len, strategy))
        start = card.num_params() * 6
        return {"label": "modelled", "peak_bytes": start + batch_size * seq_len // layout.cp * 1000, "peak_phase": phase,
                "start_bytes": start, "seq_per_rank": seq_len // layout.cp, "seconds": 0.0}
    return simulate


def test_cp_degrees_start_at_long_sequences_and_requested_ones_are_checked() -> None:
    assert cp_degrees(SMALL, 8, 8192) == [] and cp_degrees(SMALL, 8, 131072) == [2, 4, 8]
    assert cp_degrees(SMALL, 4, 131072) == [2, 4]  # control: 8 does not divide 4 GPUs
    with pytest.raises(InputError, match=r"--cp 3: does not divide --gpus 4"):
        cp_degrees(SMALL, 4, 8192, (3,))
    with pytest.raises(InputError, match=r"--cp 4: --seq 100 is not divisible by 2 x cp = 8"):
        cp_degrees(SMALL, 4, 100, (4,))


def test_cp_candidates_are_replicas_of_a_cp_group_in_pure_precision() -> None:
    found = enumerate_candidates(SMALL, 8, seq_len=131072, global_batch_tokens=4 * 131072, gpus_per_node=8,
                                 precisions=("pure", "mixed"), cp=(2, 4))
    contexted = [c for c in found if c.cp > 1]
    assert contexted and all(c.precision == "pure" and (c.dp_shard, c.tp, c.pp) == (1, 1, 1) for c in contexted)
    assert all(c.dp_replicate * c.cp == 8 and c.microbatch * c.accumulation * c.dp_replicate == 4 for c in contexted)
    assert {c.describe() for c in contexted} == {"ddp 4 x cp 2", "ddp 2 x cp 4"}
    assert not [c for c in enumerate_candidates(SMALL, 8, seq_len=131072, global_batch_tokens=4 * 131072,
                                                gpus_per_node=8, precisions=("mixed",), cp=(2, 4)) if c.cp > 1]


@pytest.mark.parametrize("phase, added", [("backward", True), ("optimizer", False)])
def test_a_cp_rank_is_modelled_and_accumulation_adds_the_gradients_outside_the_optimizer(phase, added) -> None:
    calls: list = []
    memory = RankMemoryModel(SMALL, 131072, simulate=lambda *a, **k: pytest.fail("an FSDP rank was simulated"),
                             simulate_context=context_stand_in(calls, phase))
    base = dict(gpus=8, dp_shard=1, tp=1, microbatch=1, strategy="full", precision="pure", dp_replicate=2, cp=4)
    one, two = memory.memory(Candidate(**base, accumulation=1)), memory.memory(Candidate(**base, accumulation=2))
    assert calls == [(4, 1, 131072, "full")]  # one simulation: the accumulation is modelled on top
    assert one.source.startswith("modelled: torch's ring attention on meta, 32768 tokens per rank")
    assert one.peak_bytes == one.simulated_peak_bytes and not any(one.added.values())
    assert (two.peak_bytes - one.peak_bytes == SMALL.num_params() * 2) is added


def test_the_ring_is_on_the_critical_path_and_compute_is_shared() -> None:
    times = StepTimeModel(SMALL, 131072, DEVICES["h100-sxm"])
    base = dict(gpus=8, dp_shard=1, tp=1, microbatch=1, accumulation=1, strategy="full", precision="pure")
    ring = times.step(Candidate(**base, dp_replicate=2, cp=4))
    alone = times.step(Candidate(**{**base, "gpus": 2}, dp_replicate=2))  # control: no cp, no ring
    assert alone.tp_s == 0.0 and ring.tp_s > 0.0
    assert ring.compute_s == pytest.approx(alone.compute_s / 4)


@pytest.mark.slow
def test_the_search_on_the_real_cp_rank_reads_its_modelled_peak() -> None:
    from pytest_flashckpt.config.layout import Layout
    from pytest_flashckpt.simulate.context_parallel import simulate_cp_rank

    card = load_card("llama-tiny", n_layer=1)
    request = FitRequest(card=card, seq_len=256, global_batch_tokens=256, gpus=(2,), device=DEVICES["h100-sxm"],
                         device_memory=2**30, strategies=("full",), precisions=("pure",), tp=(1,), top=5,
                         max_simulations=5, cp=(2,))
    (found,) = search(request)
    (ringed,) = [r for r in found.fitting if r.candidate.cp == 2]
    expected = simulate_cp_rank(card, Layout(cp=2), batch_size=1, seq_len=256, strategy="full")
    assert ringed.memory.peak_bytes == expected["peak_bytes"] and "modelled" in ringed.memory.source


@pytest.mark.parametrize("args, message", [
    (["--gpus", "4", "--cp", "3"], "--cp 3: does not divide --gpus 4"),
    (["--gpus", "4", "--cp", "2"], "--cp 2: a context-parallel rank is simulated in pure bf16 only"),
    (["--gpus", "4", "--cp", "4", "--seq", "100", "--global-batch-tokens", "400"], "--cp 4: --seq 100 is not divisible"),
])
def test_impossible_cp_requests_are_one_line_errors(args, message, capsys) -> None:
    argv = ["fit", "--model", "llama-tiny", "--seq", "256", "--global-batch-tokens", str(256 * 16), *args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
