"""Pipeline stages (torch.distributed.pipelining) of a small Llama on gloo ranks, pp 2 (world 2) and FSDP x pp
(dp_shard 2 x pp 2, world 4): loss and gradients against one process for GPipe, 1F1B and interleaved 1F1B; the stage's peak from the rank probe beside the CPU
allocator, and beside the same rank simulated under fake mode (``simulate.pipeline``). One torchrun launch and
three simulations per layout (268 s for both on this shared 2-core machine), so ``slow``; the stage split and the checks are in
tests/simulate/test_pipeline_sim.py and tests/config/test_layout_pipeline_cp.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("pipeline_worker.py")
# float32 sums in another order over microbatches (the schedule scales the summed gradients by 1/4): measured
# max |grad difference| 1.9e-8 on gradients up to ~5e-2, every schedule
GRAD_ATOL = 1e-6
LOSS_ATOL = 1e-5


@pytest.fixture(scope="module", params=[(1, 2, 4), (2, 2, 2)], ids=["pp2", "dp2xpp2"])
def launched(request, tmp_path_factory) -> tuple[tuple[int, int, int], list[dict]]:
    """(dp_shard, pp, microbatches) and every rank's record."""
    from pytest_flashckpt.distributed import launcher

    dp, pp, microbatches = request.param
    out = tmp_path_factory.mktemp(f"pp-{dp}x{pp}")
    launcher.run(launcher.Launch(dp * pp, timeout_s=300), str(WORKER), [str(out), str(dp), str(pp), str(microbatches)],
                 log_path=out / "launch.log")
    return request.param, [json.loads((out / f"rank-{r}.json").read_text()) for r in range(dp * pp)]


@pytest.mark.distributed
@pytest.mark.slow
def test_loss_and_gradients_match_one_process(launched) -> None:
    from pipeline_worker import SCHEDULES

    (dp, _, _), ranks = launched
    for schedule in SCHEDULES:
        names = [n for r in ranks for n in r["schedules"][schedule]["grad_names"]]
        # every parameter of the 4-block card on exactly one stage, that stage on every data-parallel rank
        assert len(set(names)) == 39 and len(names) == 39 * dp
        for record in ranks:
            entry = record["schedules"][schedule]
            assert entry["grad_max_abs"] <= GRAD_ATOL, (record["rank"], schedule, entry["grad_max_abs"])
        # each last-stage rank's loss is the mean over its data-parallel rows; the global loss is their mean
        losses = [r["schedules"][schedule]["loss"] for r in ranks if r["schedules"][schedule]["loss"] is not None]
        assert len(losses) == dp
        assert abs(sum(losses) / dp - ranks[0]["schedules"][schedule]["ref_loss"]) <= LOSS_ATOL, schedule


@pytest.mark.distributed
@pytest.mark.slow
def test_schedules_hold_what_their_order_keeps_in_flight(launched) -> None:
    """GPipe runs every microbatch's forward before any backward; 1F1B at most pp on the first stage: so with more
    microbatches than stages the first stage's forward+backward peak is lower under 1F1B. The CPU allocator adds
    what the probe adds (measured equal to the byte on every rank; bounded here at 1.5x as for FSDP ranks, whose
    gloo all-gathers stage copies outside the dispatcher)."""
    (_, pp, microbatches), ranks = launched
    first = ranks[0]["schedules"]
    if microbatches > pp:
        assert first["1f1b"]["fwd_bwd_peak_bytes"] < first["gpipe"]["fwd_bwd_peak_bytes"]
    for record in ranks:
        for entry in record["schedules"].values():
            added = entry["fwd_bwd_peak_bytes"] - entry["fwd_bwd_start_bytes"]
            assert 0 < entry["allocator_fwd_bwd_added_bytes"] <= added * 1.5, entry


@pytest.mark.distributed
@pytest.mark.slow
def test_simulated_stage_holds_what_the_gloo_stage_holds(launched) -> None:
    """The same split and schedule under fake mode, one process per schedule: every window's start and peak equal
    to the gloo rank's to the byte (simulate.pipeline: its works hold their sent tensors as gloo's do)."""
    from fresh_python import run_together

    from pipeline_worker import BATCH, CARD, SCHEDULES, SEED, SEQ

    (dp, pp, microbatches), ranks = launched
    base = ["-m", "pytest_flashckpt.simulate.pipeline", "llama-tiny", "--overrides", json.dumps(CARD), "--pp", str(pp),
            "--dp-shard", str(dp), "--microbatches", str(microbatches), "--ranks", ",".join(str(r["rank"]) for r in ranks),
            "--batch", str(BATCH), "--seq", str(SEQ), "--seed", str(SEED)]
    fake = run_together({s: [*base, "--schedule", s, "--stages-per-rank", str(n)] for s, n in SCHEDULES.items()})
    keys = ("fwd_bwd_start_bytes", "fwd_bwd_peak_bytes", "optimizer_start_bytes", "optimizer_peak_bytes", "buffer_bytes")
    for schedule in SCHEDULES:
        for record in ranks:
            real, sim = record["schedules"][schedule], fake[schedule][str(record["rank"])]
            assert sim["stages"] == real["stages"]
            assert {k: sim[k] for k in keys} == {k: real[k] for k in keys}, (schedule, record["rank"])
