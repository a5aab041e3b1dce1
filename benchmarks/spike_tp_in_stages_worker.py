"""One rank of ``spike_tp_in_stages.py`` (started by torchrun): a small Llama card cut into pipeline stages, each
stage tensor + sequence parallel over the ``tp`` dimension of the ``(pp, dp_shard, tp)`` mesh, run by torch's
``PipelineStage`` and a schedule under ``loss_parallel``: the package's build (``distributed.pipeline``:
``make_mesh``, ``build_pipeline``, ``apply_stage_tp``, ``StageShapes``), which this spike's first version wrote here
before it moved into the package. Usage: ``spike_tp_in_stages_worker.py OUT PP TP SCHEDULE LOGITS``; writes
``OUT/rank-<r>.json``.

``LOGITS``: ``dtensor`` (the package's plan, torchtitan's: the head's logits leave the last stage as a DTensor
sharded over the vocabulary, the stage's ``output_args`` a DTensor on meta) or ``local`` (the variant the spike also
measured, kept here only: the head's local shard leaves the stage and the loss function wraps it back with
``DTensor.from_local``). Between stages flows the local sequence shard of the hidden states, (rows, T / tp, C).
Records the loss and the gradients against one process, or the error a step raised (type, message, the torch file
and line that raised it).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel

from pytest_flashckpt.config.layout import Layout, PipelineSchedule
from pytest_flashckpt.distributed import fsdp
from pytest_flashckpt.distributed import pipeline as pp
from pytest_flashckpt.models.anatomy import get_anatomy
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.training import make_batch

CARD = {"n_layer": 4, "n_embd": 64, "n_head": 4, "n_kv_head": 2, "intermediate_size": 88, "vocab_size": 256, "block_size": 64}
BATCH, SEQ, SEED, MICROBATCHES = 4, 32, 1, 4


def reference():
    model = build_model(load_card("llama-tiny", **CARD), "sdpa", "cpu", torch.float32, seed=SEED)
    x, y = make_batch(model.config.vocab_size, BATCH, SEQ, SEED, 0, "cpu")
    loss = model(x, y)
    loss.backward()
    return float(loss.detach()), {n: p.grad for n, p in model.named_parameters()}


def _local_logits_schedule(model, layout: Layout, mesh, pipeline: PipelineSchedule):
    """The ``local`` variant: the package's stage pieces, with the head returning its local shard."""
    tp_mesh, n_stages = mesh["tp"], layout.pp * pipeline.stages_per_rank
    shapes, head = pp.StageShapes.of(model), get_anatomy(model).head
    stages, torch_stages = [], []
    for index in pp.stages_of_rank(mesh["pp"].get_local_rank(), layout.pp, pipeline.stages_per_rank):
        stage = pp.split_stage(model, index, n_stages)
        plan = pp.stage_plan(stage)
        if head in plan:
            plan[head] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=True)
        pp.apply_stage_tp(stage, tp_mesh, plan)
        args = shapes.stage_args(stage, BATCH // MICROBATCHES, SEQ, torch.float32, tp_mesh)
        if stage.is_last:
            args["output_args"] = args["output_args"].to_local()
        stages.append(stage)
        torch_stages.append(PipelineStage(stage, stage.index, n_stages, torch.device("cpu"), group=mesh["pp"].get_group(),
                                          **args))

    def loss_fn(out, targets):
        return pp.next_token_loss(DTensor.from_local(out, tp_mesh, [Shard(2)], run_check=False), targets)

    cls = pp.SCHEDULE_CLASSES[pipeline.schedule]
    schedule = cls(torch_stages[0] if len(torch_stages) == 1 else torch_stages, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    return stages, schedule


def run(pp_size: int, tp_size: int, schedule: str, logits: str) -> dict:
    layout = Layout(tp=tp_size, pp=pp_size)
    mesh = pp.make_mesh(layout)
    model = build_model(load_card("llama-tiny", **CARD), "sdpa", "cpu", torch.float32, seed=SEED)
    pipeline = PipelineSchedule(schedule, MICROBATCHES, 2 if schedule == "interleaved_1f1b" else 1)
    if logits == "dtensor":
        trainer = pp.build_pipeline(model, layout, mesh, pipeline, batch_size=BATCH, seq_len=SEQ, seed=SEED)
        stages, sched = trainer.stages, trainer.schedule
    else:
        stages, sched = _local_logits_schedule(model, layout, mesh, pipeline)
    x, y = make_batch(CARD["vocab_size"], BATCH, SEQ, SEED, 0, "cpu")
    losses: list = []
    has_first = any(s.is_first for s in stages)
    has_last = any(s.is_last for s in stages)
    start = time.perf_counter()
    with loss_parallel():
        sched.step(*((x,) if has_first else ()), target=y if has_last else None, losses=losses if has_last else None)
    step_s = time.perf_counter() - start
    loss = None
    if losses:
        loss = float(torch.stack([(l.full_tensor() if isinstance(l, DTensor) else l).detach() for l in losses]).mean())
    ref_loss, ref_grads = reference()
    diffs = {}
    for stage in stages:
        for name, p in stage.named_parameters():
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            diffs[stage.names[name]] = float((g - ref_grads[stage.names[name]]).abs().max())
    return {"loss": loss, "ref_loss": ref_loss, "grad_max_abs": max(diffs.values()), "n_grads": len(diffs),
            "loss_type": type(losses[0]).__name__ if losses else None, "step_s": step_s,
            "stages": [s.index for s in stages]}


if __name__ == "__main__":
    out, pp_size, tp_size, schedule, logits = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    fsdp.init(timeout_s=120)
    try:
        record = run(pp_size, tp_size, schedule, logits)
    except Exception as exc:  # the spike records torch's failure instead of stopping
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if "site-packages/torch" in f.filename]
        where = f"{frames[-1].filename.split('site-packages/')[-1]}:{frames[-1].lineno}" if frames else "?"
        record = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}", "raised_at": where,
                  "traceback": traceback.format_exc()[-3000:]}
    record["rank"] = dist.get_rank()
    (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(record), encoding="utf-8")
    dist.destroy_process_group()
