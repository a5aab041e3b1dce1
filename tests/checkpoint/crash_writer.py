"""Spawned by test_crash.py: trains the proof model and saves forever until killed.

Usage: python crash_writer.py ROOT STRATEGY. Prints "ready" once the first checkpoint is committed.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(root: Path, name: str) -> None:
    import dataclasses

    import torch

    from ckpt_helpers import CONFIGS, make_trainer
    from pytest_flashckpt.checkpoint import Checkpointer

    torch.set_num_threads(1)
    trainer = make_trainer()
    with Checkpointer(root, dataclasses.replace(CONFIGS[name], max_keep=2)) as ckpt:
        trainer.train_step()
        ckpt.save(trainer)
        ckpt.wait()
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        while True:
            trainer.train_step()
            ckpt.save(trainer)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main(Path(sys.argv[1]), sys.argv[2])
