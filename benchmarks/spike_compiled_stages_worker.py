"""Started by torchrun from benchmarks/spike_compiled_stages.py: one gloo rank of a pp 2 pipeline of a small Llama
whose stages have every block compiled (``compile_step.compile_model`` through ``pipeline.build_pipeline``'s
``before_shard``: after the activation strategy, before ``fully_shard``, torchtitan's order).

Per configuration (schedule x strategy x where the checkpoint sits): the first step's loss and gradients against
one eager process on the full batch; Dynamo's counters (frames compiled, graph breaks, graphs); the compile time of
the first step; graphs compiled after two warm steps (recompiles); and one step's forward + backward by the CPU
allocator's events, beside an eager pipeline of the same configuration, and by the rank probe made to run under
compiled code (``memory.CompiledShardedProbe``), Inductor's buffers allocated where it sees them
(``probes.compiled.inductor_buffers_dispatched``, as ``distributed.rank`` runs a compiled rank). With ``TP`` 2,
tensor parallel inside each stage (``layout.tp``, world 4): the first stage's embedding output settled in eager
before its blocks are compiled, as a compiled tensor-parallel rank is built (``tensor_parallel.settle_embedding_output``).
Writes ``rank-<r>.json``. Usage: ``..._worker.py OUT [TP]``.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters
from torch.distributed.tensor import DTensor

from pytest_flashckpt import compile_step
from pytest_flashckpt.config.axes import CompileConfig
from pytest_flashckpt.config.layout import Layout, PipelineSchedule
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.distributed import fsdp
from pytest_flashckpt.distributed import pipeline as pp
from pytest_flashckpt.distributed import tensor_parallel as tp_
from pytest_flashckpt.distributed.memory import CompiledShardedProbe
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.probes.allocator import allocator_added_peak
from pytest_flashckpt.probes.compiled import inductor_buffers_dispatched
from pytest_flashckpt.training import make_batch

CARD = {"n_layer": 4, "n_embd": 64, "n_head": 4, "n_kv_head": 2, "intermediate_size": 88, "vocab_size": 256, "block_size": 64}
BATCH, SEQ, SEED = 4, 32, 1
# (schedule, stages per rank, microbatches, strategy, checkpoint outside the compiled block)
CONFIGS = (
    ("1f1b", 1, 2, "none", False), ("1f1b", 1, 2, "selective_op", False), ("1f1b", 1, 2, "full", False),
    ("1f1b", 1, 2, "full", True), ("gpipe", 1, 2, "full", False), ("interleaved_1f1b", 2, 2, "full", False),
)
TP_CONFIGS = (  # tensor parallel inside the stages: what a compiled tensor-parallel rank trains (test_compiled_ranks)
    ("1f1b", 1, 2, "none", False), ("1f1b", 1, 2, "selective_op", False), ("1f1b", 1, 2, "full", True),
    ("gpipe", 1, 2, "full", True),
)


def card():
    return load_card("llama-tiny", **CARD)


def reference():
    model = build_model(card(), "sdpa", "cpu", torch.float32, seed=SEED)
    x, y = make_batch(model.config.vocab_size, BATCH, SEQ, SEED, 0, "cpu")
    loss = model(x, y)
    loss.backward()
    return float(loss.detach()), {n: p.grad for n, p in model.named_parameters()}


def trainer(layout, mesh, schedule, per_rank, microbatches, strategy, outside, compiled, regions):
    model = build_model(card(), "sdpa", "cpu", torch.float32, seed=SEED)
    config = CompileConfig(scope="block", ac_wrapper="outside" if outside else "inside")

    def compile_blocks(part) -> None:
        if layout.tp > 1:  # the first stage's embedding (on a later stage a no-op: it receives plain hidden states)
            tp_.settle_embedding_output(part)
        regions.append(compile_step.compile_model(part, config))

    before = compile_blocks if compiled else None
    return pp.build_pipeline(model, layout, mesh, PipelineSchedule(schedule, microbatches, per_rank), batch_size=BATCH,
                             seq_len=SEQ, seed=SEED, activation=ActivationConfig(strategy=strategy), before_shard=before)


def _full(tensor):
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def run(layout, mesh, ref_loss, ref_grads, schedule, per_rank, microbatches, strategy, outside) -> dict:
    torch._dynamo.reset()
    counters.clear()
    regions: list[int] = []
    compiled = trainer(layout, mesh, schedule, per_rank, microbatches, strategy, outside, True, regions)
    started = time.perf_counter()
    loss = compile_step.torch_hidden_warning(compiled.forward_backward)()
    compile_s = time.perf_counter() - started
    diffs = {stage.names[n]: float((_full(p.grad) - ref_grads[stage.names[n]]).abs().max())
             for stage in compiled.stages for n, p in stage.named_parameters()}
    compiled.optimizer.zero_grad(set_to_none=True)
    for _ in range(2):
        compile_step.torch_hidden_warning(compiled.train_step)()
    graphs = compile_step.dynamo_counts()[0]
    compiled_added = allocator_added_peak(compile_step.torch_hidden_warning(compiled.forward_backward))
    compiled.optimizer_step()
    windows = compile_step.torch_hidden_warning(lambda: pp.memory_step(compiled, probe_class=CompiledShardedProbe))()
    eager = trainer(layout, mesh, schedule, per_rank, microbatches, strategy, outside, False, [])
    for _ in range(2):
        eager.train_step()
    eager_added = allocator_added_peak(eager.forward_backward)
    return {"loss": None if loss is None else float(loss), "ref_loss": ref_loss,
            "grad_max_abs": max(diffs.values()), "regions_compiled": sum(regions), "compile_s": round(compile_s, 2),
            "frames_ok": counters["frames"]["ok"], "graph_breaks": sum(counters["graph_break"].values()),
            "break_reasons": sorted(counters["graph_break"])[:2], "unique_graphs": counters["stats"]["unique_graphs"],
            "recompiles": compile_step.dynamo_counts()[0] - graphs,
            "allocator_fwd_bwd_added_bytes": compiled_added, "eager_allocator_fwd_bwd_added_bytes": eager_added,
            "probe_fwd_bwd_peak_bytes": windows["fwd_bwd_peak_bytes"], "probe_fwd_bwd_start_bytes": windows["fwd_bwd_start_bytes"]}


if __name__ == "__main__":
    out, tp = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1
    fsdp.init(timeout_s=600)
    layout = Layout(dp_shard=1, tp=tp, pp=2)
    mesh = pp.make_mesh(layout)
    ref_loss, ref_grads = reference()
    record = {"rank": dist.get_rank(), "tp": tp, "configs": {}}
    for schedule, per_rank, microbatches, strategy, outside in CONFIGS if tp == 1 else TP_CONFIGS:
        key = f"{schedule} {strategy}" + (" outside" if outside else "")
        try:
            with inductor_buffers_dispatched():
                record["configs"][key] = run(layout, mesh, ref_loss, ref_grads, schedule, per_rank, microbatches,
                                             strategy, outside)
        except Exception as exc:  # what a configuration fails with is its record (both ranks fail alike or hang)
            record["configs"][key] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300],
                                      "traceback": traceback.format_exc()[-2000:]}
        dist.barrier()
    (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
    dist.destroy_process_group()
