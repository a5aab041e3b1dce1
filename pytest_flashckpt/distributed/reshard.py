"""The resharding proof: save at N ranks, load at M ranks, compare with the gathered original bit for bit.

Run under torchrun (``launcher.run(..., "pytest_flashckpt.distributed.reshard", [...])``), one launch per world size
and phase, every rank doing all of its phase's saves or loads:

- ``save`` at N: train ``steps`` steps, a sync save, one more step, an async save, then ``continue_steps`` more
  steps. Rank 0 writes the gathered full state at each save and after the continued steps (``ref-N-*.safetensors``).
- ``load`` at M, for every saved N: load both checkpoints into a fresh FSDP trainer and compare the gathered state
  with ``ref-N-*`` bit for bit; continue ``continue_steps`` steps from the async checkpoint and compare with
  ``ref-N-continued``: bit for bit when N == M (the same reductions in the same order), else the largest
  difference is recorded for the caller to hold against its tolerance. Rank 0 writes ``load-M.json``.

The model is a tiny GPT (2 blocks, width 32; the tiny card with those overrides), so a launch costs mostly process
start-up.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from pytest_flashckpt.distributed import fsdp, sharded_store
from pytest_flashckpt.models.gpt import GPTConfig

TINY = GPTConfig(name="tiny", n_layer=2, n_embd=32, n_head=2, vocab_size=128, block_size=16)
BATCH, SEQ = 4, 8  # the global batch: 4 rows split over 1, 2 or 4 ranks


def make_trainer(distributed: bool = True):
    trainer, _ = fsdp.build_trainer(TINY, batch_size=BATCH, seq_len=SEQ, seed=1, distributed=distributed)
    return trainer


def _write_ref(trainer, path: Path) -> None:
    state = sharded_store.gathered_state(trainer)
    if dist.get_rank() == 0:
        save_file({k: v.clone().contiguous() for k, v in state.items()}, str(path))


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel())


def save_phase(root: Path, steps: int, continue_steps: int) -> None:
    world = dist.get_world_size()
    trainer = make_trainer()
    folder = root / f"w{world}"
    with sharded_store.ShardedCheckpointer(folder) as sync_ckpt:
        for _ in range(steps):
            trainer.train_step()
        sync_ckpt.save(trainer)
        _write_ref(trainer, root / f"ref-{world}-sync.safetensors")
    trainer.train_step()
    with sharded_store.ShardedCheckpointer(folder, async_save=True) as async_ckpt:
        async_ckpt.save(trainer)
        _write_ref(trainer, root / f"ref-{world}-async.safetensors")  # the staged copy is independent of later steps
        for _ in range(continue_steps):
            trainer.train_step()  # overlaps the async write
    _write_ref(trainer, root / f"ref-{world}-continued.safetensors")


def load_phase(root: Path, saved: list[int], continue_steps: int) -> None:
    world = dist.get_world_size()
    report: dict[str, dict] = {}
    for n in saved:
        folder = root / f"w{n}"
        checkpoints = sorted(p for p in folder.iterdir() if p.name.startswith("ckpt-"))
        entry: dict = {}
        for kind, ckpt in zip(("sync", "async"), checkpoints):
            trainer = make_trainer()
            sharded_store.load(trainer, ckpt)
            state = sharded_store.gathered_state(trainer)
            if dist.get_rank() == 0:
                ref = load_file(str(root / f"ref-{n}-{kind}.safetensors"))
                entry[f"{kind}_differences"] = sharded_store.bitwise_differences(state, ref)
                entry[f"{kind}_tensors"] = len(ref)
            if kind == "async":
                for _ in range(continue_steps):
                    trainer.train_step()
                state = sharded_store.gathered_state(trainer)
                if dist.get_rank() == 0:
                    ref = load_file(str(root / f"ref-{n}-continued.safetensors"))
                    entry["continued_differences"] = sharded_store.bitwise_differences(state, ref)
                    entry["continued_max_abs"] = max_difference(state, ref)
        report[str(n)] = entry
    if dist.get_rank() == 0:
        (root / f"load-{world}.json").write_text(json.dumps(report, indent=1), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("phase", choices=("save", "load"))
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--saved", type=int, nargs="*", default=[], help="load: the world sizes whose checkpoints to load")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--continue-steps", type=int, default=2)
    args = parser.parse_args(argv)
    torch.use_deterministic_algorithms(True)
    fsdp.init(timeout_s=120)
    try:
        if args.phase == "save":
            save_phase(args.root, args.steps, args.continue_steps)
        else:
            load_phase(args.root, args.saved, args.continue_steps)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
