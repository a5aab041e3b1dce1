"""Started by torchrun from benchmarks/fit_check.py: one gloo rank of world 4 that times training steps of a small
Llama at three layouts (dp_shard 4, dp_shard 2 x tp 2, tp 4), interleaved round by round so the shared machine's
load falls on all three alike, and calibrates the time model's two rates on the same ranks: a bf16 matmul of the
step's shape (FLOP/s of one rank's thread) and a gloo all-gather over the 4 ranks (bytes/s per rank, ring form).
In the same rounds every rank also times a step of its own, unsharded model at dp_shard 4's local batch, with no
collective: what one rank's compute reaches on this machine (its fraction of the matmul rate is the ``--mfu`` a user
sets from a measured run), measured apart from the layouts it is used to rank.
Rank 0 writes ``OUT/rank-0.json``. Usage: ``fit_check_worker.py OUT ROUNDS``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from pytest_flashckpt.config.layout import Layout
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.distributed import tensor_parallel as tp
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.training import Trainer

CARD = {"n_layer": 2, "n_embd": 512, "n_head": 8, "n_kv_head": 4, "intermediate_size": 1376, "vocab_size": 2048}
GLOBAL_BATCH, SEQ, STRATEGY, STEPS = 8, 256, "none", 2
LAYOUTS = ((4, 1), (2, 2), (1, 4))
ONE_RANK = "one rank"  # the unsharded step at dp_shard 4's local batch, no collective


def card():
    return load_card("llama-tiny", **CARD)


def matmul_flops_per_s(rows: int, inner: int, outer: int, reps: int = 20) -> float:
    a, b = torch.randn(rows, inner, dtype=torch.bfloat16), torch.randn(inner, outer, dtype=torch.bfloat16)
    a @ b
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * rows * inner * outer * reps / (time.perf_counter() - start)


def allgather_bytes_per_s(nbytes: int, reps: int = 10) -> float:
    world = dist.get_world_size()
    out = torch.empty(nbytes // 2, dtype=torch.bfloat16)
    shard = torch.empty(out.numel() // world, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(out, shard)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(reps):
        dist.all_gather_into_tensor(out, shard)
    elapsed = (time.perf_counter() - start) / reps
    return (world - 1) / world * nbytes / elapsed


def allgather_hop_latency_s(reps: int = 50) -> float:
    """A few-element all-gather's time per ring hop: gloo's latency, which bandwidth alone does not count."""
    world = dist.get_world_size()
    out, shard = torch.empty(world * 4), torch.empty(4)
    dist.all_gather_into_tensor(out, shard)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(reps):
        dist.all_gather_into_tensor(out, shard)
    return (time.perf_counter() - start) / reps / (world - 1)


def main() -> None:
    out, rounds = Path(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    trainers = {}
    for dp, t in LAYOUTS:
        layout = Layout(dp_shard=dp, tp=t)
        mesh = tp.make_mesh(layout)
        trainers[(dp, t)] = tp.build_trainer(card(), layout, mesh, batch_size=GLOBAL_BATCH, seq_len=SEQ, seed=0,
                                             dtype=torch.bfloat16, activation=ActivationConfig(strategy=STRATEGY))[0]
        trainers[(dp, t)].train_step()  # warm: AdamW's state exists
    alone = Trainer.create(build_model(card(), "sdpa", "cpu", torch.bfloat16, seed=0), GLOBAL_BATCH // LAYOUTS[0][0],
                           SEQ, seed=0)
    alone.train_step()
    timed = {**{f"{dp}x{t}": trainer for (dp, t), trainer in trainers.items()}, ONE_RANK: alone}
    times: dict[str, list[float]] = {key: [] for key in timed}
    for _ in range(rounds):
        for key, trainer in timed.items():
            dist.barrier()
            start = time.perf_counter()
            for _ in range(STEPS):
                trainer.train_step()
            dist.barrier()
            times[key].append((time.perf_counter() - start) / STEPS)
    c = card()
    rows = GLOBAL_BATCH // 2 * SEQ  # the dp2 x tp2 rank's tokens: a middle shape
    record = {
        "step_s": times, "median_step_s": {k: statistics.median(v) for k, v in times.items()},
        "matmul_flops_per_s": statistics.median(matmul_flops_per_s(rows, c.n_embd, c.intermediate_size) for _ in range(3)),
        "allgather_bytes_per_s": statistics.median(allgather_bytes_per_s(8 * 2**20) for _ in range(3)),
        "allgather_hop_latency_s": statistics.median(allgather_hop_latency_s() for _ in range(3)),
        "card": CARD, "global_batch": GLOBAL_BATCH, "seq": SEQ, "strategy": STRATEGY, "steps": STEPS, "rounds": rounds,
    }
    if dist.get_rank() == 0:
        (out / "rank-0.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
