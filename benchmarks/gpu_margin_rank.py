"""Started by torchrun from benchmarks/gpu_margin.py (``distributed.launcher``): one NCCL rank of an FSDP step,
measured as the one-process rows are (``gpu_margin.measure_trainer``: warm-up, the counted step, the recorded step).
Each rank writes ``OUT/rank-<rank>.json`` (and, with pickles on, ``OUT/snapshots/rank-<rank>.pickle``).

Usage: ``gpu_margin_rank.py OUT CARD STRATEGY GLOBAL_BATCH SEQ_LEN PICKLES(0|1) ATTENTION``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from gpu_margin import build_trainer, measure_trainer  # this script's folder is first on sys.path


def join_group():
    """The process group torchrun describes, NCCL on this rank's GPU (``distributed.fsdp.init``); its device."""
    from pytest_flashckpt.distributed.fsdp import init

    return init()


def main(argv: list[str]) -> None:
    out, card, strategy, batch, seq_len, pickles, attention = argv
    device = join_group()
    try:
        rank = dist.get_rank()
        trainer, backend = build_trainer(card, strategy, int(batch), int(seq_len), device, distributed=True,
                                         attention=attention)
        pickle_path = Path(out) / "snapshots" / f"rank-{rank}.pickle" if pickles == "1" else None
        measured = measure_trainer(trainer, device, pickle_path)
        measured["backend"] = backend
        (Path(out) / f"rank-{rank}.json").write_text(json.dumps(measured, indent=1) + "\n", encoding="utf-8")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
