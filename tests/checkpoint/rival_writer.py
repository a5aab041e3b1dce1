"""Spawned by test_ckpt_roots.py: one of two processes racing for the same checkpoint roots.

Usage: python rival_writer.py PARENT forward|reverse. Waits for "go" on stdin, then tries to become the writer of
``PARENT/<config>`` for every config of ``ckpt_helpers.CONFIGS`` (in that order or reversed) and holds what it gets;
prints one JSON line {"pid", "held": [...], "refused": {config: message}}; waits for "save", saves three steps into
every root it holds, closes them and prints "done".
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(parent: Path, order: str) -> None:
    import torch

    from ckpt_helpers import CONFIGS, make_trainer
    from pytest_flashckpt.checkpoint import Checkpointer, FolderLockedError

    torch.set_num_threads(1)
    names = list(CONFIGS) if order == "forward" else list(reversed(CONFIGS))
    assert sys.stdin.readline().strip() == "go"
    held, refused = {}, {}
    for name in names:
        try:
            held[name] = Checkpointer(parent / name, CONFIGS[name])
        except FolderLockedError as exc:
            refused[name] = str(exc)
    print(json.dumps({"pid": os.getpid(), "held": sorted(held), "refused": refused}), flush=True)
    assert sys.stdin.readline().strip() == "save"
    for name, ckpt in held.items():
        trainer = make_trainer()
        with ckpt:
            for _ in range(3):
                trainer.train_step()
                ckpt.save(trainer)
    print("done", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main(Path(sys.argv[1]), sys.argv[2])
