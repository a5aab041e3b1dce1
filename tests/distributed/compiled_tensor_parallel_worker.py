"""Started by torchrun from test_compiled_tensor_parallel.py: one rank of a dp_shard x tp layout (tp 1: FSDP alone) of
the small Llama card of ``tensor_parallel_worker``, every block compiled (Inductor) after the activation strategy and
before ``fully_shard``, under tensor parallel the embedding's output settled in eager first, as ``distributed.rank``
builds a compiled rank.

Per strategy (``full:outside``: with ``compile.ac_wrapper: outside``): the first step's loss and gradients (gathered from the DTensors; a parameter without a gradient is
listed) beside one eager process on the full batch, Dynamo's graph and break counts, then two more steps and
one step read by the rank probe made to run under compiled code (``simulate.rank_probe.CompiledRankProbe``), Inductor's
buffers allocated where it sees them (``probes.compiled.inductor_buffers_dispatched``).
Writes ``rank-<r>.json``. Usage: ``compiled_tensor_parallel_worker.py OUT DP TP STRATEGIES [--no-settle]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from pytest_flashckpt import compile_step
from pytest_flashckpt.config.axes import CompileConfig
from pytest_flashckpt.config.layout import Layout
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.distributed import fsdp
from pytest_flashckpt.distributed import tensor_parallel as tp
from pytest_flashckpt.probes.compiled import inductor_buffers_dispatched
from pytest_flashckpt.simulate.rank_probe import CompiledRankProbe

from tensor_parallel_worker import BATCH, SEED, SEQ, _full, card, reference

def compiled_trainer(layout: Layout, mesh, strategy: str, settle: bool):
    strategy, _, wrapper = strategy.partition(":")  # "full:outside": compile.ac_wrapper outside
    config = CompileConfig(scope="block", ac_wrapper=wrapper or "inside")  # type: ignore[arg-type]
    activation = ActivationConfig(strategy, budget=0.5) if strategy == "compile_budget" else ActivationConfig(strategy)
    backend = compile_step.budget_backend(0.5) if strategy == "compile_budget" else None

    def compile_blocks(model: torch.nn.Module) -> None:
        if settle:
            tp.settle_embedding_output(model)
        compile_step.compile_model(model, config, backend)

    return tp.build_trainer(card(), layout, mesh, batch_size=BATCH, seq_len=SEQ, seed=SEED, activation=activation,
                            before_shard=compile_blocks)[0]


def against_one_process(layout: Layout, mesh, strategy: str, settle: bool, ref_loss: float, ref_grads: dict) -> dict:
    torch._dynamo.reset()
    trainer = compiled_trainer(layout, mesh, strategy, settle)
    graphs_before = compile_step.dynamo_counts()[0]
    try:
        loss = tp.forward_backward(trainer)
    except Exception as exc:  # what a compiled layout fails with is the record (the test reads it)
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]}
    graphs, _, breaks = compile_step.dynamo_counts()
    loss_t = torch.tensor(float(_full(loss).mean()))
    dist.all_reduce(loss_t)
    named = dict(trainer.model.named_parameters())
    no_grad = sorted(n for n, p in named.items() if p.grad is None)
    grads = {n: _full(p.grad) for n, p in named.items() if p.grad is not None}
    diffs = {n: float((grads[n] - ref_grads[n]).abs().max()) for n in grads}
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.step += 1
    for _ in range(2):
        trainer.train_step()  # the compiled step goes on training
    memory = tp.memory_step(trainer, probe_class=CompiledRankProbe)  # the rank probe, run under compiled code
    return {"memory": memory, "loss": float(loss_t) / dist.get_world_size(), "ref_loss": ref_loss, "no_grad": no_grad,
            "grad_max_abs": max(diffs.values(), default=0.0), "n_grads": len(grads),
            "graphs": graphs - graphs_before, "breaks": sum(breaks.values())}


if __name__ == "__main__":
    out, dp, tp_size, strategies = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
    settle = "--no-settle" not in sys.argv[5:] and tp_size > 1  # FSDP alone: no tensor-parallel embedding to settle
    fsdp.init(timeout_s=240)
    layout = Layout(dp_shard=dp, tp=tp_size)
    layout.check_world(dist.get_world_size())
    mesh = tp.make_mesh(layout)
    ref_loss, ref_grads = reference()
    record = {"rank": dist.get_rank(), "strategies": {}}
    for strategy in strategies:
        # as distributed.rank runs a compiled rank: Inductor's buffers where the rank probe sees them
        with compile_step.fsdp_compiled_block_outputs(), inductor_buffers_dispatched():
            record["strategies"][strategy] = against_one_process(layout, mesh, strategy, settle, ref_loss, ref_grads)
    (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(record), encoding="utf-8")
    dist.destroy_process_group()
