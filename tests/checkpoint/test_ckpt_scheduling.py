"""Memory-aware scheduling: saves wait while memory is high, each deferral recorded, never skipped forever."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from ckpt_helpers import make_trainer
from pytest_flashckpt.checkpoint import Checkpointer
from pytest_flashckpt.checkpoint.scheduling import SaveSchedule, process_memory
from pytest_flashckpt.config.scenario import SaveConfig


@given(
    interval=st.integers(1, 4),
    max_defer=st.integers(0, 5),
    readings=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=60),
)
def test_saves_are_deferred_but_never_skipped_forever(interval: int, max_defer: int, readings: list[float]) -> None:
    it = iter(readings * 100)
    schedule = SaveSchedule(interval, 0.5, max_defer, gauge=lambda: (int(next(it) * 1000), 1000))
    saved: list[int] = []
    due: int | None = None
    for step in range(1, 41):
        if due is None and step % interval == 0:
            due = step
        if schedule.should_save(step):
            saved.append(step)
            assert due is not None and step - due <= max_defer
            due = None
    assert due is None or 40 - due <= max_defer
    for d in schedule.deferrals:
        assert d.fraction >= d.threshold and 0 <= d.step - d.due_step < max_defer and d.capacity_bytes == 1000
    assert len(saved) >= 40 // (interval + max_defer)


def test_checkpointer_defers_under_pressure_and_records_it(tmp_path) -> None:
    pressure = iter([0.95, 0.95, 0.1, 0.99, 0.99, 0.99, 0.99])
    trainer = make_trainer()
    config = SaveConfig(save_interval=1, mem_threshold=0.9, max_defer_steps=2)
    with Checkpointer(tmp_path, config, gauge=lambda: (int(next(pressure) * 100), 100)) as ckpt:
        saved = []
        for _ in range(6):
            trainer.train_step()
            record = ckpt.maybe_save(trainer)
            saved.append(record and (record.step, record.forced))
    assert saved == [None, None, (3, False), None, None, (6, True)]
    assert [(d.step, d.due_step, d.fraction) for d in ckpt.schedule.deferrals] == [(1, 1, 0.95), (2, 1, 0.95), (4, 4, 0.99), (5, 4, 0.99)]


def test_default_gauge_reads_this_process() -> None:
    used, capacity = process_memory()
    assert 0 < used < capacity


def test_a_mid_step_look_defers_a_due_save_to_the_step_end() -> None:
    """``observe`` (after the forward pass) records the deferral of a save due in this step while memory is high;
    it never takes a save; the step-end look takes it when memory has dropped, and says at what reading."""
    readings = iter([0.8, 0.3, 0.8, 0.3])  # mid-step high, step end low, twice
    schedule = SaveSchedule(2, 0.6, 2, gauge=lambda: (int(next(readings) * 100), 100))
    schedule.observe(1)  # nothing due in step 1: no reading taken
    assert not schedule.should_save(1)
    schedule.observe(2)
    assert schedule.should_save(2)
    schedule.observe(3)
    assert not schedule.should_save(3)
    schedule.observe(4)
    assert schedule.should_save(4)
    assert [(d.step, d.due_step, d.phase) for d in schedule.deferrals] == [(2, 2, "mid-step"), (4, 4, "mid-step")]
    assert schedule.taken_fractions == [0.3, 0.3] and schedule.forced == []


@pytest.mark.usefixtures("small_bandwidth_probes")
def test_peak_basis_gauge_counts_live_tensor_bytes_against_the_measured_peak(tmp_path) -> None:
    from pytest_flashckpt.checkpoint import run_checkpoint_pass
    from pytest_flashckpt.probes import make_probe

    trainer = make_trainer()
    trainer.train_step()  # AdamW state exists from here on: the state between steps is complete
    with make_probe("cpu").track(resident=trainer.state_tensors()) as reading:
        trainer.train_step()
    state, peak = reading.start_bytes, reading.peak_bytes
    threshold = (state / peak + 1.0) / 2  # above the training state alone, below the step's peak
    config = SaveConfig(save_interval=1, mem_threshold=threshold, mem_basis="peak", max_defer_steps=2, saves=2)
    metrics = run_checkpoint_pass(trainer, config, tmp_path, peak_bytes=peak)
    assert metrics["forced_saves"] == 0 and metrics["max_save_memory_fraction"] < threshold
    assert metrics["mem_threshold_bytes"] == int(threshold * peak)
    # a threshold under the training state itself can never be met: every save is forced, and says so
    low = SaveConfig(save_interval=1, mem_threshold=0.5 * state / peak, mem_basis="peak", max_defer_steps=1, saves=1)
    assert run_checkpoint_pass(trainer, low, tmp_path / "low", peak_bytes=peak)["forced_saves"] == 1
