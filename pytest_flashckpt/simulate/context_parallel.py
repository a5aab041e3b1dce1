"""Context parallel with the CUDA flash op, simulated (modelled): one cp rank's training step on ``meta`` with
torch's own ring attention.

torch's ``context_parallel`` shards the sequence over ``cp`` ranks and runs every attention call as ring attention
(``torch.distributed.tensor.experimental._context_parallel._attention``): a rank's queries stay, the keys and
values of the other ranks come to it. A cp rank composed with FSDP and tensor parallel runs on gloo ranks and is
simulated by the real engine under fake mode with the CPU flash op (``distributed.context_parallel``,
``simulate.fake_ranks``: equal to the byte, reports/spike-cp-ranks.md). This module is the other route: the CUDA
flash op aborts under fake mode, so a cp rank with the op a GPU runs is simulated on ``meta``, where that op returns
its true shapes:

- the rank's step is the project's meta step (``simulate.simulate_step``: the real model, activation strategy and
  AdamW, counted by the attributed probe) at ``seq / cp`` tokens: every activation a rank holds;
- each attention call is torch's ring attention itself, forward and backward (its
  ``_scaled_dot_product_ring_flash_attention`` and ``..._backward``, the functions ``context_parallel`` dispatches
  the flash op to), run over a fake process group of ``cp`` ranks (``distributed.context_parallel.ring_attention``).
  So what they allocate is counted as torch allocates it: with torch's default rotation (``allgather``) the
  forward all-gathers every rank's K/V once (``cp`` x the local K and V) and merges block outputs in float32
  (``convert_to_f32``), the backward all-gathers K/V again and rotates the K/V gradients (float32) with
  all-to-all; ``alltoall`` rotates one neighbour's K/V at a time. The load-balanced ring (each rank holds chunk
  ``r`` and ``2 cp - 1 - r``, torch's default) needs ``seq`` divisible by ``2 cp`` (``config.layout``).

What the ring adds to a rank's peak (``ring_extra_bytes``, against the same step with each rank's attention over
its own chunk) depends on where the peak falls. Outside attention the exchange buffers are gone and one copy per
block stays: the ring's merged output is (B, H, T, D)-contiguous where the flash op's is laid out (B, T, H, D),
so the model's reshape before ``o_proj`` copies it (a query-sized tensor saved for backward per block; measured
on llama-tiny at cp 2, exactly that). When the peak falls inside a ring backward, its K/V and float32 K/V
gradient exchange buffers add to it (llama-tiny, 1 block, at cp 4).

Labelled ``modelled``: the model's rotary positions are the local chunk's (same shapes, other values), the sequence
is built at ``seq / cp`` rather than sharded, and the CUDA allocator has not measured any of it (the GPU suite
will). Parameters, gradients and optimizer state are a whole replica's: this route composes cp with nothing else
(the composed rank is ``simulate.fake_ranks``').
"""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

from pytest_flashckpt.config.layout import Layout
from pytest_flashckpt.distributed.context_parallel import ROTATIONS, ring_attention
from pytest_flashckpt.simulate.step import simulate_step
from pytest_flashckpt.simulate.workload import dtype_name

LABEL = "modelled"  # until the GPU suite measures a cp rank


def check_request(card, layout: Layout, *, batch_size: int, seq_len: int, kernel: str, dtype: str,
                  load_balanced: bool, rotation: str) -> None:
    """The request a cp rank can be simulated for, or a ``ValueError`` naming the axis or option and the fix."""
    if layout.cp < 2:
        raise ValueError(f"layout cp {layout.cp}: context parallel needs cp >= 2 (cp 1 is the plain meta step)")
    others = {axis: getattr(layout, axis) for axis in ("dp_shard", "tp", "pp") if getattr(layout, axis) > 1}
    if others:
        named = ", ".join(f"{axis} {size}" for axis, size in others.items())
        raise ValueError(f"layout {layout.describe()}: the CUDA-op ring on meta simulates cp alone ({named}); a cp rank "
                         "composed with dp_shard or tp is simulate.fake_ranks' (the CPU flash op), or use cp only")
    dtype = dtype_name(dtype)
    if rotation not in ROTATIONS:
        raise ValueError(f"context parallel rotation {rotation!r} is unknown; use one of {', '.join(ROTATIONS)}")
    if kernel not in ("flash", "flash_attn") or dtype not in ("bfloat16", "float16"):
        raise ValueError(
            f"context parallel: ring attention is simulated with the CUDA flash op (kernel flash, dtype bf16 or "
            f"fp16), got kernel {kernel} in {dtype}; use --kernel flash --dtype bf16"
        )
    layout.check_sequence(seq_len, load_balanced=load_balanced)
    if seq_len > card.block_size:
        raise ValueError(f"sequence {seq_len} exceeds block_size {card.block_size} of model card {card.name!r}")


def simulate_cp_rank(
    card,
    layout: Layout,
    *,
    batch_size: int,
    seq_len: int,
    dtype: str = "bfloat16",
    kernel: str = "flash",
    strategy: str = "none",
    k: int = 2,
    rank: int = 0,
    load_balanced: bool = True,
    rotation: str = "allgather",
    seed: int = 0,
) -> dict:
    """Rank ``rank`` of ``cp`` ranks sharing a ``seq_len`` sequence: the meta step at ``seq_len / cp`` tokens with
    torch's ring attention, and the same step with each rank's attention over its own chunk only (what the ring
    adds is the difference). Bytes per rank; ``label`` is ``modelled``."""
    if dist.is_initialized():
        raise RuntimeError("simulate_cp_rank needs a process without a process group (it starts the fake one)")
    check_request(card, layout, batch_size=batch_size, seq_len=seq_len, kernel=kernel, dtype=dtype,
                  load_balanced=load_balanced, rotation=rotation)
    local = seq_len // layout.cp
    step = dict(card=card, dtype=dtype, batch_size=batch_size, seq_len=local, kernel=kernel, strategy=strategy, k=k,
                target="cuda", seed=seed)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=layout.cp)
    try:
        mesh = init_device_mesh("cpu", (layout.cp,), mesh_dim_names=("cp",))
        with ring_attention(mesh, rotation, load_balanced):
            ringed = simulate_step(**step)
    finally:
        dist.destroy_process_group()
    alone = simulate_step(**step)
    return {
        "label": LABEL,
        "rank": rank,
        "cp": layout.cp,
        "seq_per_rank": local,
        "rotation": rotation,
        "load_balanced": load_balanced,
        "peak_bytes": ringed.peak_bytes,
        "peak_phase": ringed.peak_phase,
        "peak_op": ringed.peak_op,
        "start_bytes": ringed.start_bytes,
        "breakdown": dict(ringed.breakdown),
        "local_attention_peak_bytes": alone.peak_bytes,
        "ring_extra_bytes": ringed.peak_bytes - alone.peak_bytes,
        "seconds": ringed.seconds + alone.seconds,
    }


def main(argv: list[str] | None = None) -> None:
    """``python -m pytest_flashckpt.simulate.context_parallel CARD --cp 4 --batch 1 --seq 131072``: the rank's
    record as JSON on the last line of stdout; a refused request is one line on stderr, exit status 2."""
    import argparse
    import json
    import sys

    from pytest_flashckpt.models.cards import load_card

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("card")
    parser.add_argument("--overrides", default="{}", help="card overrides as JSON, e.g. '{\"block_size\": 131072}'")
    parser.add_argument("--cp", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--strategy", default="none")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--rotation", default="allgather", choices=ROTATIONS)
    parser.add_argument("--no-load-balance", action="store_true")
    args = parser.parse_args(argv)
    try:
        card = load_card(args.card, **json.loads(args.overrides))
        record = simulate_cp_rank(card, Layout(cp=args.cp), batch_size=args.batch, seq_len=args.seq, dtype=args.dtype,
                                  strategy=args.strategy, rank=args.rank, rotation=args.rotation,
                                  load_balanced=not args.no_load_balance)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: --cp {args.cp} --seq {args.seq}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(json.dumps(record))


if __name__ == "__main__":
    main()
