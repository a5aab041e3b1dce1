"""Context parallel, simulated (modelled): one cp rank's training step on ``meta`` with torch's own ring attention.

torch's ``context_parallel`` shards the sequence over ``cp`` ranks and runs every attention call as ring attention
(``torch.distributed.tensor.experimental._context_parallel._attention``): a rank's queries stay, the keys and
values of the other ranks come to it. It does not run on a CPU (``aten._scaled_dot_product_flash_attention_for_cpu``
has no sharding strategy, measured on gloo for issue 32) and the CUDA flash op aborts under fake mode, so a cp rank
is simulated on ``meta``, where the CUDA flash op returns its true shapes:

- the rank's step is the project's meta step (``simulate.simulate_step``: the real model, activation strategy and
  AdamW, counted by the attributed probe) at ``seq / cp`` tokens: every activation a rank holds;
- each attention call is torch's ring attention itself, forward and backward (its
  ``_scaled_dot_product_ring_flash_attention`` and ``..._backward``, the functions ``context_parallel`` dispatches
  the flash op to), run over a fake process group of ``cp`` ranks (``_ring_attention``). So what they allocate is
  counted as torch allocates it: with torch's default rotation (``allgather``) the forward all-gathers every
  rank's K/V once (``cp`` x the local K and V) and merges block outputs in float32 (``convert_to_f32``), the
  backward all-gathers K/V again and rotates the K/V gradients (float32) with all-to-all; ``alltoall`` rotates one
  neighbour's K/V at a time. The load-balanced ring (each rank holds chunk ``r`` and ``2 cp - 1 - r``, torch's
  default) needs ``seq`` divisible by ``2 cp`` (``config.layout``).

What the ring adds to a rank's peak (``ring_extra_bytes``, against the same step with each rank's attention over
its own chunk) depends on where the peak falls. Outside attention the exchange buffers are gone and one copy per
block stays: the ring's merged output is (B, H, T, D)-contiguous where the flash op's is laid out (B, T, H, D),
so the model's reshape before ``o_proj`` copies it (a query-sized tensor saved for backward per block; measured
on llama-tiny at cp 2, exactly that). When the peak falls inside a ring backward, its K/V and float32 K/V
gradient exchange buffers add to it (llama-tiny, 1 block, at cp 4).

Labelled ``modelled``, not simulated by the real engine end to end: the model's rotary positions are the local
chunk's (same shapes, other values), the sequence is not sharded by ``context_parallel``'s buffer sharding but
built at ``seq / cp``, and the CUDA allocator has not measured any of it (the GPU suite will). Parameters,
gradients and optimizer state are a whole replica's (cp ranks replicate them unless FSDP shards over dp x cp; cp
is composed with nothing else here).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor.experimental._context_parallel import _attention as ring
from torch.testing._internal.distributed.fake_pg import FakeStore

from pytest_flashckpt.config.layout import Layout
from pytest_flashckpt.models import attention
from pytest_flashckpt.simulate.step import simulate_step
from pytest_flashckpt.simulate.workload import dtype_name

ROTATIONS = ("allgather", "alltoall")
LABEL = "modelled"  # until the GPU suite measures a cp rank


class _RingFlashAttention(torch.autograd.Function):
    """The CUDA flash op as ``context_parallel`` runs it: torch's ring forward, and its ring backward with what
    the flash op saves for backward (q, k, v, out, logsumexp, the RNG state)."""

    @staticmethod
    def forward(ctx, q, k, v, mesh: DeviceMesh, dropout_p: float):
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset, *_ = ring._scaled_dot_product_ring_flash_attention(
            mesh, q, k, v, dropout_p, True)
        ctx.save_for_backward(q, k, v, out, lse, cum_q, cum_k, seed, offset)
        ctx.mesh, ctx.dropout_p, ctx.max_q, ctx.max_k = mesh, dropout_p, max_q, max_k
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, cum_q, cum_k, seed, offset = ctx.saved_tensors
        grad_q, grad_k, grad_v, *_ = ring._scaled_dot_product_ring_flash_attention_backward(
            ctx.mesh, grad_out, q, k, v, out, lse, cum_q, cum_k, ctx.max_q, ctx.max_k, ctx.dropout_p, True, seed,
            offset)
        return grad_q, grad_k, grad_v, None, None


@contextlib.contextmanager
def _ring_attention(mesh: DeviceMesh, rotation: str, load_balanced: bool):
    """While active, the models' explicit CUDA flash op (``models.attention``) runs as torch's ring attention over
    ``mesh``, with ``rotation`` and load balancing set in torch's own context-parallel options."""
    explicit = attention._explicit_op
    options = ring._cp_options
    saved = (options.rotate_method, options.enable_load_balance)

    def ring_op(q, k, v, backend, dropout_p):
        if backend != "sdpa-flash":
            raise ValueError(f"context parallel is simulated with the CUDA flash op; the step ran {backend}")
        return _RingFlashAttention.apply(q, k, v, mesh, dropout_p)

    ring.set_rotate_method(rotation)
    options.enable_load_balance = load_balanced
    attention._explicit_op = ring_op
    try:
        yield
    finally:
        attention._explicit_op = explicit
        options.rotate_method, options.enable_load_balance = saved


def check_request(card, layout: Layout, *, batch_size: int, seq_len: int, kernel: str, dtype: str,
                  load_balanced: bool, rotation: str) -> None:
    """The request a cp rank can be simulated for, or a ``ValueError`` naming the axis or option and the fix."""
    if layout.cp < 2:
        raise ValueError(f"layout cp {layout.cp}: context parallel needs cp >= 2 (cp 1 is the plain meta step)")
    others = {axis: getattr(layout, axis) for axis in ("dp_shard", "tp", "pp") if getattr(layout, axis) > 1}
    if others:
        named = ", ".join(f"{axis} {size}" for axis, size in others.items())
        raise ValueError(f"layout {layout.describe()}: context parallel is simulated alone so far ({named}); use cp only")
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
        with _ring_attention(mesh, rotation, load_balanced):
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
