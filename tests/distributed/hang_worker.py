"""Started by torchrun from test_launcher.py: rank 1 hangs (sleeps) while rank 0 waits for it in a collective."""

import sys
import time

import torch.distributed as dist

from pytest_flashckpt.distributed import fsdp

if __name__ == "__main__":
    fsdp.init(timeout_s=600)
    print(f"rank {dist.get_rank()} ready", flush=True)
    if dist.get_rank() == 1:
        time.sleep(1000)
    dist.barrier()
    sys.exit(0)
