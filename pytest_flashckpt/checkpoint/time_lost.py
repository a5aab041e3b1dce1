"""Time lost per save: what the training loop really loses to one save, stall plus slowdown of the steps it overlaps.

``save_stall_s`` only counts the time the save call (and, overlapped, the fence) blocks; a background copy or write
also slows the steps it shares the machine with (on a 2-core CPU a writer thread takes a core from the matmuls), and
that cost is invisible to a stall timer. So we time whole windows, interleaved like the step timing of the runner:

* plain window: ``K`` training steps;
* saving window: one save, then the same ``K`` steps, then waiting until that save is committed (a save that has not
  finished after ``K`` steps would delay the next one: its remainder is lost time too).

Rounds alternate which window runs first (A B, B A, ...), so drifts hit both alike. ``time_lost_s`` is the median
over rounds of (saving - plain); the per-round samples of both windows are returned for a rank test. ``K`` is the
save interval of the config (the steps a save really has to hide behind), at least 1 and at most
``MAX_WINDOW_STEPS`` (a suite may save every 1000 steps; four steps already give a background save room to hide).
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from pathlib import Path
from typing import Callable, Protocol

import torch

from pytest_flashckpt.checkpoint.checkpointer import Checkpointer
from pytest_flashckpt.config.scenario import SaveConfig
from pytest_flashckpt.core.metrics import Measurements
from pytest_flashckpt.training import Trainer


MAX_WINDOW_STEPS = 4


def _timed(fn: Callable[[], None], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


class Saver(Protocol):
    """What the windows need of a saver: ``save`` returns when training may continue, ``wait`` until committed."""

    def save(self, trainer: Trainer) -> object: ...

    def wait(self) -> None: ...


def measure_time_lost(
    trainer: Trainer, config: SaveConfig, workdir: Path, rounds: int | None = None, steps: int | None = None, saver: Saver | None = None
) -> Measurements:
    """Interleaved plain / saving windows of ``steps`` (default ``config.save_interval``, at most ``MAX_WINDOW_STEPS``) training steps for
    ``rounds`` (default ``config.time_lost_rounds``) rounds, saving with ``config`` into ``workdir`` (newest kept).

    Returns ``Measurements``: ``time_lost_s`` (median of per-round saving - plain), ``time_lost_min_s``,
    ``time_lost_max_s``, ``time_lost_window_steps``, ``time_lost_plain_s`` and ``time_lost_saving_s`` (median plain
    and saving windows), each median with its per-round samples. One untimed save first (it allocates staging
    buffers, and a selective strategy's later saves are the selected tensors on top of it). The trainer advances.
    ``saver`` replaces the ``Checkpointer`` built from ``config`` (benchmarks compare savers that are no strategy of
    ours); the caller then owns it (closes it, reads its records)."""
    rounds = config.time_lost_rounds if rounds is None else rounds
    steps = max(1, min(config.save_interval, MAX_WINDOW_STEPS) if steps is None else steps)
    if rounds <= 0:
        raise ValueError(f"time_lost_rounds must be positive to measure time lost, got {rounds}")
    device = next(trainer.model.parameters()).device
    cfg = dataclasses.replace(config, max_keep=1)  # rotation keeps a selective checkpoint's base

    def plain() -> None:
        for _ in range(steps):
            trainer.train_step()

    with contextlib.nullcontext(saver) if saver is not None else Checkpointer(Path(workdir), cfg) as ckpt:

        def saving() -> None:
            ckpt.save(trainer)
            for _ in range(steps):
                trainer.train_step()
            ckpt.wait()

        trainer.train_step()
        ckpt.save(trainer)
        ckpt.wait()
        plain_s: list[float] = []
        saving_s: list[float] = []
        for r in range(rounds):
            order = [(plain, plain_s), (saving, saving_s)]
            for fn, out in order if r % 2 == 0 else reversed(order):
                out.append(_timed(fn, device))
    lost = [s - p for s, p in zip(saving_s, plain_s)]
    out = Measurements()
    out.record("time_lost_s", statistics.median(lost), samples=lost)
    out.record("time_lost_min_s", min(lost))
    out.record("time_lost_max_s", max(lost))
    out.record("time_lost_window_steps", steps)
    out.record("time_lost_plain_s", statistics.median(plain_s), samples=plain_s)
    out.record("time_lost_saving_s", statistics.median(saving_s), samples=saving_s)
    return out
