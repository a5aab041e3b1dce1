"""Started by torchrun from test_faults.py: two ranks, one committed save, then rank 1 SIGKILLs itself while DCP is
writing its shards of the second save (after rank 0's temporary folder exists, before anything is committed)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter

from pytest_flashckpt.distributed import fsdp, sharded_store
from pytest_flashckpt.distributed.reshard import make_trainer


def die_while_writing(self, plan, planner):
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    root = Path(sys.argv[1])
    fsdp.init(timeout_s=60)
    trainer = make_trainer()
    with sharded_store.ShardedCheckpointer(root) as ckpt:
        trainer.train_step()
        ckpt.save(trainer)
        trainer.train_step()
        if dist.get_rank() == 1:
            FileSystemWriter.write_data = die_while_writing
        ckpt.save(trainer)
    dist.destroy_process_group()
