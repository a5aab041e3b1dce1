"""One rank of ``spike_tp_in_stages.py`` (started by torchrun): a small Llama card cut into pipeline stages
(``distributed.pipeline.split_stage``), each stage tensor + sequence parallel over the ``tp`` dimension of a 3D mesh
``(pp, dp_shard, tp)`` built by ``init_device_mesh``, run by torch's ``PipelineStage`` and a schedule, the loss under
``loss_parallel``. Usage: ``spike_tp_in_stages_worker.py OUT PP TP SCHEDULE LOGITS``; writes ``OUT/rank-<r>.json``.

``LOGITS``: ``dtensor`` (torchtitan's plan: the head's logits leave the last stage as a DTensor sharded over the
vocabulary, the stage's ``output_args`` a DTensor on meta) or ``local`` (the head's local shard leaves the stage,
the loss function wraps it back with ``DTensor.from_local``). Between stages flows the local sequence shard of the
hidden states, (rows, T / tp, C), as torchtitan's stages send. Records the loss and the gradients against one
process, or the error a step raised (type, message, the torch file and line that raised it).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, loss_parallel, parallelize_module

from pytest_flashckpt.config.layout import PipelineSchedule
from pytest_flashckpt.distributed import fsdp
from pytest_flashckpt.distributed import pipeline as pp
from pytest_flashckpt.distributed import tensor_parallel as tp
from pytest_flashckpt.models.anatomy import get_anatomy, get_blocks
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.training import make_batch

CARD = {"n_layer": 4, "n_embd": 64, "n_head": 4, "n_kv_head": 2, "intermediate_size": 88, "vocab_size": 256, "block_size": 64}
BATCH, SEQ, SEED, MICROBATCHES = 4, 32, 1, 4


class SeqShardedStage(pp.StageModule):
    """The spike's stage: a stage that is not first receives (rows, T / tp, C) and hands the family's forward
    token ids of the whole sequence (its rotary tables are the whole sequence's, as in one process)."""

    tp_size = 1

    def forward(self, inputs):
        if self._received is None:
            return self.part(inputs)
        self._received.hidden = inputs
        tokens = torch.zeros((), dtype=torch.long, device=inputs.device).expand(inputs.shape[0], inputs.shape[1] * self.tp_size)
        return self.part(tokens)


def reference():
    model = build_model(load_card("llama-tiny", **CARD), "sdpa", "cpu", torch.float32, seed=SEED)
    x, y = make_batch(model.config.vocab_size, BATCH, SEQ, SEED, 0, "cpu")
    loss = model(x, y)
    loss.backward()
    return float(loss.detach()), {n: p.grad for n, p in model.named_parameters()}


def run(pp_size: int, tp_size: int, schedule: str, logits: str) -> dict:
    mesh = init_device_mesh("cpu", (pp_size, 1, tp_size), mesh_dim_names=("pp", "dp_shard", "tp"))
    tp_mesh = mesh["tp"]
    model = build_model(load_card("llama-tiny", **CARD), "sdpa", "cpu", torch.float32, seed=SEED)
    anatomy = get_anatomy(model)
    per_rank = 2 if schedule == "interleaved_1f1b" else 1
    n_stages = pp_size * per_rank
    pp_rank = mesh["pp"].get_local_rank()
    stages = []
    for index in pp.stages_of_rank(pp_rank, pp_size, per_rank):
        base = pp.split_stage(model, index, n_stages)
        stage = SeqShardedStage(base.part, base.index, base.n_stages, base.names)
        stage.tp_size = tp_size
        root = {}
        if stage.is_first:
            root[anatomy.embeddings[0]] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
        if stage.is_last:
            root[anatomy.final_norm] = SequenceParallel()
            root[anatomy.head] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1),
                                                 use_local_output=logits == "local")
        parallelize_module(stage.part, tp_mesh, root)
        plan = tp.block_plan(stage.part)
        for block in get_blocks(stage.part):
            parallelize_module(block, tp_mesh, plan)
        stages.append(stage)
    rows = BATCH // MICROBATCHES
    width, vocab = CARD["n_embd"], CARD["vocab_size"]
    torch_stages = []
    for stage in stages:
        hidden = torch.empty(rows, SEQ // tp_size, width, device="meta", requires_grad=True)
        tokens = torch.empty(rows, SEQ, dtype=torch.long, device="meta")
        local_logits = torch.empty(rows, SEQ, vocab // tp_size, device="meta", requires_grad=True)
        out_logits = (DTensor.from_local(local_logits, tp_mesh, [Shard(2)], run_check=False)
                      if logits == "dtensor" else local_logits)
        torch_stages.append(PipelineStage(stage, stage.index, n_stages, torch.device("cpu"), group=mesh["pp"].get_group(),
                                          input_args=tokens if stage.is_first else hidden,
                                          output_args=out_logits if stage.is_last else hidden))

    def loss_fn(out, targets):
        if not isinstance(out, DTensor):
            out = DTensor.from_local(out, tp_mesh, [Shard(2)], run_check=False)
        return pp.next_token_loss(out, targets)

    cls = pp.SCHEDULE_CLASSES[schedule]
    sched = cls(torch_stages[0] if per_rank == 1 else torch_stages, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    x, y = make_batch(vocab, BATCH, SEQ, SEED, 0, "cpu")
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
