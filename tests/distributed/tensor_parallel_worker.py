"""Started by torchrun from test_tensor_parallel.py: one rank of a dp_shard x tp layout of a small Llama card.

Per activation strategy: the first step's loss and gradients (gathered from the DTensors) beside one process on
the full batch, then one step measured by the rank probe (``tensor_parallel.memory_step``) and the next identical
step's two windows by the CPU allocator's events (and the same in mixed precision, no checkpointing). Then a DCP save of the (``none``) trainer after two steps, with
the gathered full state written by rank 0 for the test to load into one process and compare bit for bit, and
the same checkpoint loaded here into FSDP alone over every rank (1D), compared by rank 0; and, where the test wrote
one, a one-process checkpoint loaded into the layout (one process -> the layout). Writes ``rank-<r>.json``. Usage: ``tensor_parallel_worker.py OUT DP TP STRATEGIES``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pytest_flashckpt.config.layout import Layout
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.distributed import fsdp, sharded_store
from pytest_flashckpt.distributed import tensor_parallel as tp
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.probes.allocator import allocator_added_peak
from pytest_flashckpt.training import make_batch

CARD = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_kv_head": 2, "intermediate_size": 88, "vocab_size": 256, "block_size": 64}
BATCH, SEQ, SEED = 4, 32, 1


def card():
    return load_card("llama-tiny", **CARD)


def reference() -> tuple[float, dict[str, torch.Tensor]]:
    """One process, the full global batch: the first step's loss and gradients."""
    model = build_model(card(), "sdpa", "cpu", torch.float32, seed=SEED)
    x, y = make_batch(model.config.vocab_size, BATCH, SEQ, SEED, 0, "cpu")
    loss = model(x, y)
    loss.backward()
    return float(loss.detach()), {n: p.grad for n, p in model.named_parameters()}


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _trainer(layout: Layout, mesh, strategy: str, precision: str = "pure"):
    dtype = torch.bfloat16 if precision == "mixed" else torch.float32
    return tp.build_trainer(card(), layout, mesh, batch_size=BATCH, seq_len=SEQ, seed=SEED, dtype=dtype,
                            activation=ActivationConfig(strategy=strategy), precision=precision)[0]


def against_one_process(layout: Layout, mesh, strategy: str, ref_loss: float, ref_grads: dict) -> dict:
    trainer = _trainer(layout, mesh, strategy)
    loss = tp.forward_backward(trainer)
    loss = float(_full(loss).mean())  # each dp rank's mean over its rows; the global loss is their mean
    loss_t = torch.tensor(loss)
    dist.all_reduce(loss_t)
    grads = {n: _full(p.grad) for n, p in trainer.model.named_parameters()}
    diffs = {n: float((grads[n] - ref_grads[n]).abs().max()) for n in ref_grads}
    trainer.optimizer.zero_grad(set_to_none=True)
    return {"loss": float(loss_t) / dist.get_world_size(), "ref_loss": ref_loss, "grad_max_abs": max(diffs.values()),
            "grad_ref_max": max(float(g.abs().max()) for g in ref_grads.values()), "n_grads": len(grads)}


class _CollectiveBytes(TorchDispatchMode):
    """Bytes of the inputs and outputs of every collective this thread issues (``c10d`` and functional ``c10d``
    ops, their waits and autograd wrappers excepted): all gloo can stage or hold of a window's traffic."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace in ("c10d", "_c10d_functional") and not func.__name__.startswith(("wait", "_wrap")):
            tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
            self.bytes += sum(t.numel() * t.element_size() for t in tensors)
        return out


def memory(layout: Layout, mesh, strategy: str, precision: str = "pure") -> dict:
    trainer = _trainer(layout, mesh, strategy, precision)
    trainer.train_step()
    record = tp.memory_step(trainer)
    with _CollectiveBytes() as collectives:
        tp.forward_backward(trainer)
    trainer.optimizer.zero_grad(set_to_none=True)
    record["collective_fwd_bwd_bytes"] = collectives.bytes
    record["allocator_fwd_bwd_added_bytes"] = allocator_added_peak(lambda: tp.forward_backward(trainer))
    record["allocator_optimizer_added_bytes"] = allocator_added_peak(lambda: tp.optimizer_step(trainer))
    return record


def save(layout: Layout, mesh, out: Path) -> dict:
    trainer = _trainer(layout, mesh, "none")
    for _ in range(2):
        trainer.train_step()
    with sharded_store.ShardedCheckpointer(out / "ckpt") as checkpointer:
        checkpointer.save(trainer)
    state = sharded_store.gathered_state(trainer)
    if dist.get_rank() == 0:
        save_file({k: v.clone().contiguous() for k, v in state.items()}, str(out / "ref.safetensors"))
    return {"saved_step": trainer.step, "local_state_bytes": sharded_store.local_bytes(sharded_store.training_state(trainer))}


def load_into(layout: Layout, mesh, checkpoints: Path, ref: Path) -> dict:
    """The latest checkpoint under ``checkpoints`` loaded into a fresh trainer of ``layout``, gathered, and compared
    by rank 0 with the state in ``ref`` (a safetensors file) bit for bit."""
    trainer = _trainer(layout, mesh, "none")
    sharded_store.load(trainer, sharded_store.latest(checkpoints))
    state = sharded_store.gathered_state(trainer)
    if dist.get_rank() != 0:
        return {}
    want = load_file(str(ref))
    return {"differences": sharded_store.bitwise_differences(state, want), "tensors": len(want), "step": trainer.step}


def load_1d(out: Path) -> dict:
    """The checkpoint loaded into FSDP alone over every rank (dp_shard = world, tp 1), gathered, against the ref."""
    layout = Layout(dp_shard=dist.get_world_size(), tp=1)
    return load_into(layout, tp.make_mesh(layout), out / "ckpt", out / "ref.safetensors")


def load_one_process(layout: Layout, mesh, out: Path) -> dict:
    """A checkpoint saved by one process (``one/``, written by the test before the launch) loaded into this layout,
    gathered, against that process's state (``one-ref.safetensors``): one process -> the layout."""
    return load_into(layout, mesh, out / "one", out / "one-ref.safetensors")


if __name__ == "__main__":
    out, dp, tp_size, strategies = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
    fsdp.init(timeout_s=120)
    layout = Layout(dp_shard=dp, tp=tp_size)
    layout.check_world(dist.get_world_size())
    mesh = tp.make_mesh(layout)
    ref_loss, ref_grads = reference()
    record = {"rank": dist.get_rank(), "strategies": {}}
    for strategy in strategies:
        record["strategies"][strategy] = {**against_one_process(layout, mesh, strategy, ref_loss, ref_grads),
                                          **memory(layout, mesh, strategy)}
    record["mixed"] = memory(layout, mesh, "none", "mixed")  # FSDP2's MixedPrecisionPolicy over the TP shards
    record["save"] = save(layout, mesh, out)
    record["load_1d"] = load_1d(out)
    if (out / "one").is_dir():
        record["load_from_one_process"] = load_one_process(layout, mesh, out)
    (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(record), encoding="utf-8")
    dist.destroy_process_group()
