"""One rank of ``spike_compiled_layouts.py`` (started by torchrun): llama-tiny on a dp_shard x tp layout, built in
torchtitan's order (TP, then activation checkpointing, then ``torch.compile`` per block, then FSDP2), trained eager
and then compiled. Usage: ``spike_compiled_layouts_worker.py OUT DP TP STRATEGY``; writes ``OUT/rank-<r>.json``.

Per side: the first step's wall time (compile time for the compiled side), the median of 3 timed steps, Dynamo's
graphs, frames and graph breaks, the compiled regions one step ran (``torch.profiler`` events, the allocator view
``compile_step.read_step``), the loss after 3 steps; or the error a side raised (type, message, the torch file
and line that raised it)."""

from __future__ import annotations

import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.config.layout import Layout
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.distributed import fsdp
from pytest_flashckpt.distributed import tensor_parallel as tp
from pytest_flashckpt.models.anatomy import get_blocks
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.compile_step import budget_backend, compile_model, dynamo_counts as _dynamo_counts, read_step
from pytest_flashckpt.config.axes import CompileConfig

BATCH, SEQ, SEED = 4, 256, 1


def build(mesh, layout: Layout, strategy: str, compiled: bool) -> tp.ParallelTrainer:
    strategy, _, order = strategy.partition(":")  # "full:outside": the checkpoint outside the compiled block
    model = build_model(load_card("llama-tiny"), "sdpa", "cpu", torch.float32, seed=SEED)
    if layout.tp > 1:
        tp.apply_tp(model, mesh["tp"])
    budget = strategy == "compile_budget"  # torch's activation_memory_budget at 0.5 (eager: no checkpointing)
    apply_ac(model, ActivationConfig(strategy=strategy, **({"budget": 0.5} if budget else {})))
    if compiled:
        if layout.tp > 1:
            tp.settle_embedding_output(model)  # without it the compiled TP block fails in backward
        # the product's per-block compile (role hooks dropped), with the budget's backend where it is the strategy;
        # ":outside" = compile.ac_wrapper outside (each checkpointed block's own forward compiled, the checkpoint eager)
        config = CompileConfig(scope="block", ac_wrapper="outside" if order == "outside" else "inside")
        compile_model(model, config, budget_backend(0.5) if budget else None)
    if layout.dp_shard > 1:
        for block in get_blocks(model):
            fully_shard(block, mesh=mesh["dp_shard"])
        fully_shard(model, mesh=mesh["dp_shard"])
    trainer = tp.ParallelTrainer.create(model, BATCH, SEQ, seed=SEED)
    trainer.rank, trainer.world_size = mesh["dp_shard"].get_local_rank(), layout.dp_shard
    trainer.tensor_parallel = layout.tp > 1
    return trainer


def _full(t: torch.Tensor) -> float:
    return float((t.full_tensor() if hasattr(t, "full_tensor") else t).float().mean())


def side(mesh, layout: Layout, strategy: str, compiled: bool) -> dict:
    torch._dynamo.reset()
    trainer = build(mesh, layout, strategy, compiled)
    start = time.perf_counter()
    trainer.train_step()
    first = time.perf_counter() - start
    for _ in range(2):
        loss = trainer.train_step()
    times = []
    for _ in range(3):
        dist.barrier()
        start = time.perf_counter()
        trainer.train_step()
        times.append(time.perf_counter() - start)
    graphs, frames, breaks = _dynamo_counts()
    reading = read_step(trainer.train_step)
    return {"first_step_s": first, "step_s": statistics.median(times), "graphs": graphs, "frames": frames,
            "graph_breaks": sum(breaks.values()), "regions_per_step": reading.compiled_regions, "loss_after_3": _full(loss)}


def _error(exc: BaseException) -> dict:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/torch/" in f.filename]
    where = f"{frames[-1].filename.split('site-packages/')[-1]}:{frames[-1].lineno}" if frames else "?"
    text = str(exc).splitlines()[0]
    if len(text) > 160:  # e.g. a list of 13 types: its head and its tail (where the odd one is)
        text = f"{text[:90]} ... {text[-60:]}"
    return {"error": f"{type(exc).__name__}: {text}", "raised_at": where}


if __name__ == "__main__":
    out, dp, tp_size, strategy = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    fsdp.init(timeout_s=180)
    layout = Layout(dp_shard=dp, tp=tp_size)
    mesh = tp.make_mesh(layout)
    record = {"rank": dist.get_rank()}
    for compiled in (False, True):
        try:
            record["compiled" if compiled else "eager"] = side(mesh, layout, strategy, compiled)
        except Exception as exc:  # the spike records what broke; both ranks break alike (the same graph)
            record["compiled" if compiled else "eager"] = _error(exc)
    (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
    dist.destroy_process_group()
