"""Started by torchrun from test_pipeline.py and test_pipeline_tp.py: one rank of a ``pp`` x ``dp_shard`` x ``tp``
pipeline of a small Llama card (tensor parallel inside the stages when ``TP`` > 1).

Per schedule (``gpipe``, ``1f1b``, ``interleaved_1f1b`` with 2 stages per rank): the first step's loss (on the
last stage) and gradients (mapped to the whole model's names) beside one process on the full batch, then after a
warm step one step measured by the rank probe (``pipeline.memory_step``) and the next identical step's
forward+backward by the CPU allocator's events. Writes ``rank-<r>.json``. Usage:
``pipeline_worker.py OUT DP PP MICROBATCHES [TP]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from pytest_flashckpt.config.layout import Layout, PipelineSchedule
from pytest_flashckpt.distributed import fsdp
from pytest_flashckpt.distributed import pipeline as pp
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.probes.allocator import allocator_added_peak
from pytest_flashckpt.training import make_batch

# 4 blocks (2 stages per rank for the interleaved schedule), untied head, odd sizes
CARD = {"n_layer": 4, "n_embd": 64, "n_head": 4, "n_kv_head": 2, "intermediate_size": 88, "vocab_size": 256, "block_size": 64}
BATCH, SEQ, SEED = 4, 32, 1
SCHEDULES = {"gpipe": 1, "1f1b": 1, "interleaved_1f1b": 2}  # schedule -> stages per rank


def card():
    return load_card("llama-tiny", **CARD)


def reference() -> tuple[float, dict[str, torch.Tensor]]:
    model = build_model(card(), "sdpa", "cpu", torch.float32, seed=SEED)
    x, y = make_batch(model.config.vocab_size, BATCH, SEQ, SEED, 0, "cpu")
    loss = model(x, y)
    loss.backward()
    return float(loss.detach()), {n: p.grad for n, p in model.named_parameters()}


def _trainer(layout: Layout, mesh, pipeline: PipelineSchedule) -> pp.PipelineTrainer:
    model = build_model(card(), "sdpa", "cpu", torch.float32, seed=SEED)
    return pp.build_pipeline(model, layout, mesh, pipeline, batch_size=BATCH, seq_len=SEQ, seed=SEED)


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, torch.distributed.tensor.DTensor) else t


def against_one_process(layout, mesh, pipeline, ref_loss: float, ref_grads: dict) -> dict:
    trainer = _trainer(layout, mesh, pipeline)
    loss = trainer.forward_backward()
    diffs = {stage.names[n]: float((_full(p.grad) - ref_grads[stage.names[n]]).abs().max())
             for stage in trainer.stages for n, p in stage.named_parameters()}
    return {"loss": None if loss is None else float(loss), "ref_loss": ref_loss, "grad_max_abs": max(diffs.values()),
            "grad_names": sorted(diffs)}


def memory(layout, mesh, pipeline) -> dict:
    trainer = _trainer(layout, mesh, pipeline)
    trainer.train_step()
    record = pp.memory_step(trainer)
    record["allocator_fwd_bwd_added_bytes"] = allocator_added_peak(trainer.forward_backward)
    return record


if __name__ == "__main__":
    out, dp, pp_size, microbatches = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    tp_size = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    fsdp.init(timeout_s=120)
    layout = Layout(dp_shard=dp, tp=tp_size, pp=pp_size)
    layout.check_world(dist.get_world_size())
    mesh = pp.make_mesh(layout)
    ref_loss, ref_grads = reference()
    record = {"rank": dist.get_rank(), "schedules": {}}
    for schedule, per_rank in SCHEDULES.items():
        pipeline = PipelineSchedule(schedule, microbatches, per_rank)
        record["schedules"][schedule] = {**against_one_process(layout, mesh, pipeline, ref_loss, ref_grads),
                                         **memory(layout, mesh, pipeline)}
    (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(record), encoding="utf-8")
    dist.destroy_process_group()
