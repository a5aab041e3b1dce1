"""Memory-aware scheduling: saves wait while memory is high, each deferral recorded, never skipped forever."""

from __future__ import annotations

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
