"""Started by torchrun from test_rank_memory.py: per activation strategy, one FSDP2 rank of a card of odd sizes
measures one step (forward + backward, then the optimizer step) with the rank probe the distributed runner uses,
then the next identical step's two windows from the CPU allocator's profiler events; writes ``rank-<r>.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.distributed import fsdp, rank
from pytest_flashckpt.models import GPTConfig
from pytest_flashckpt.probes.allocator import allocator_added_peak


def measure(card: GPTConfig, strategy: str, batch: int, seq: int, device) -> dict:
    trainer, _ = fsdp.build_trainer(card, batch_size=batch, seq_len=seq, activation=ActivationConfig(strategy=strategy))
    trainer.train_step()
    record = rank._memory_step(trainer, "cpu", device)

    def forward_backward() -> None:
        x, y = trainer.batch()
        trainer.model(x, y).backward()

    def optimizer() -> None:
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)

    record["allocator_fwd_bwd_added_bytes"] = allocator_added_peak(forward_backward)
    record["allocator_optimizer_added_bytes"] = allocator_added_peak(optimizer)
    return record


if __name__ == "__main__":
    out, card, strategies = Path(sys.argv[1]), GPTConfig(**json.loads(sys.argv[2])), sys.argv[3].split(",")
    batch, seq = int(sys.argv[4]), int(sys.argv[5])
    device = fsdp.init(timeout_s=120)
    records = {strategy: measure(card, strategy, batch, seq, device) for strategy in strategies}
    (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(records), encoding="utf-8")
    dist.destroy_process_group()
