"""Started by torchrun from test_pipeline_checkpoint.py: one rank of ``dp_shard x pp 2`` stages of the small Llama
card of ``pipeline_worker``, checkpointed as the distributed suite checkpoints them (``sharded_store`` on the
stages under the whole model's names, ``PipelineTrainer.model``).

After two steps: a sharded save of the stages; the checkpoint loaded into fresh stages, and into FSDP alone over
every rank (1D), each compared with the saved state bit for bit on every rank (its own parameters); rank 0 writes
the saved state of every stage (``ref.safetensors``) for the test to load the checkpoint into one process. Then a
checkpoint of an FSDP (1D) trainer after three steps, loaded into fresh stages and compared alike (1D -> stages).
Writes ``rank-<r>.json``. Usage: ``pipeline_checkpoint_worker.py OUT DP``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from pytest_flashckpt.config.layout import Layout, PipelineSchedule
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.distributed import fsdp, sharded_store
from pytest_flashckpt.distributed import pipeline as pp
from pytest_flashckpt.models.cards import build_model

from pipeline_worker import BATCH, SEED, SEQ, card


def stages(layout: Layout, mesh, seed: int) -> pp.PipelineTrainer:
    model = build_model(card(), "sdpa", "cpu", torch.float32, seed=seed)
    return pp.build_pipeline(model, layout, mesh, PipelineSchedule("1f1b", 4 // layout.dp_shard), batch_size=BATCH,
                             seq_len=SEQ, seed=SEED, activation=ActivationConfig("full"))


def one_d(seed: int):
    return fsdp.build_trainer(card(), batch_size=BATCH, seq_len=SEQ, seed=seed)[0]


def differences(loaded: dict[str, torch.Tensor], saved: dict[str, torch.Tensor]) -> int:
    """Tensors of ``saved`` that ``loaded`` lacks or holds in other bits (``loaded`` may hold more: 1D holds all)."""
    return len(sharded_store.bitwise_differences({k: loaded[k] for k in saved if k in loaded}, saved))


def summed(value: int) -> int:
    box = torch.tensor([value])
    dist.all_reduce(box)
    return int(box)


if __name__ == "__main__":
    out, dp = Path(sys.argv[1]), int(sys.argv[2])
    fsdp.init(timeout_s=120)
    layout = Layout(dp_shard=dp, tp=1, pp=2)
    mesh = pp.make_mesh(layout)
    trainer = stages(layout, mesh, SEED)
    for _ in range(2):
        trainer.train_step()
    with sharded_store.ShardedCheckpointer(out / "stages") as ckpt:
        ckpt.save(trainer)
    saved = sharded_store.local_full_state(trainer)
    record = {"rank": dist.get_rank(), "keys": len(saved), "step": trainer.step}

    fresh = stages(layout, mesh, SEED + 5)  # other weights: a load that does nothing cannot pass
    record["unloaded_differences"] = summed(differences(sharded_store.local_full_state(fresh), saved))
    sharded_store.load(fresh, sharded_store.latest(out / "stages"))
    record["stages_differences"] = summed(differences(sharded_store.local_full_state(fresh), saved))
    record["stages_step"] = fresh.step

    flat = one_d(SEED + 5)
    sharded_store.load(flat, sharded_store.latest(out / "stages"))
    whole = sharded_store.local_full_state(flat)  # every rank: the whole model's state
    record["one_d_differences"] = summed(differences(whole, saved))
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, sorted(saved))
    record["stage_keys_cover_1d"] = sorted({k for keys in every for k in keys}) == sorted(whole)
    if dist.get_rank() == 0:
        parts: list = [None] * dist.get_world_size()
        dist.gather_object({k: v.clone().contiguous() for k, v in saved.items()}, parts, dst=0)
        save_file({k: v for part in parts for k, v in part.items()}, str(out / "ref.safetensors"))
    else:
        dist.gather_object({k: v.clone().contiguous() for k, v in saved.items()}, None, dst=0)

    source = one_d(SEED)  # the other way: an FSDP checkpoint into stages
    for _ in range(3):
        source.train_step()
    with sharded_store.ShardedCheckpointer(out / "one_d") as ckpt:
        ckpt.save(source)
    source_state = sharded_store.local_full_state(source)
    into = stages(layout, mesh, SEED + 5)
    sharded_store.load(into, sharded_store.latest(out / "one_d"))
    mine = sharded_store.local_full_state(into)
    record["from_1d_differences"] = summed(len(sharded_store.bitwise_differences(
        mine, {k: source_state[k] for k in mine})))
    (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(record), encoding="utf-8")
    dist.destroy_process_group()
