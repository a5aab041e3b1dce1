"""Crash safety: a saving process killed (SIGKILL) at random points never leaves ``latest`` naming an unloadable
checkpoint, every committed checkpoint still loads, and the root's writer lock died with the process."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckpt_helpers import make_trainer
from pytest_flashckpt.checkpoint import load_into, resume_latest
from pytest_flashckpt.checkpoint.lock import WriterLock
from pytest_flashckpt.checkpoint.store import CheckpointStore

WRITER = Path(__file__).with_name("crash_writer.py")
TRIALS = 24


@pytest.mark.slow
def test_killed_saves_leave_a_loadable_latest(tmp_path) -> None:
    rng = random.Random(1234)
    names = ["sync-torch", "sync-safetensors", "async-torch", "layerwise-safetensors", "selective-trainable", "dcp"]
    for trial in range(TRIALS):
        root = tmp_path / f"trial{trial}"
        name = names[trial % len(names)]
        log = tmp_path / f"trial{trial}.log"
        with open(log, "w") as err, subprocess.Popen([sys.executable, str(WRITER), str(root), name], stdout=subprocess.PIPE, stderr=err, text=True) as proc:
            try:
                ready = proc.stdout.readline().strip()
                time.sleep(rng.uniform(0.0, 0.6))
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
        assert ready == "ready", log.read_text()
        store = CheckpointStore(root)
        latest = store.latest_name()
        assert latest is not None, f"trial {trial} ({name}): no latest"
        load_into(make_trainer(init_seed=1), root / latest)
        for folder in store.complete():
            load_into(make_trainer(init_seed=1), folder)
        assert resume_latest(make_trainer(init_seed=1), root).folder.name == latest
        WriterLock(root).acquire().release()  # never left locked: the flock went with the killed process
