"""Context parallel through torch's own ring attention, on a CPU as on a GPU (issue 32, docs/layouts.md).

``cp`` ranks share each sequence: every rank holds ``seq / cp`` of its tokens and runs every attention call as
ring attention, its queries staying, the other ranks' keys and values coming to it. torch's public
``context_parallel`` context manager reaches the ring by dispatching SDPA's CUDA ops; the CPU flash op
(``aten._scaled_dot_product_flash_attention_for_cpu``) has no entry there, so that context manager does not run on
gloo ranks (measured for issue 32). The ring itself does not care which op it runs:
``_templated_ring_attention`` and its backward take the attention op as an argument. So a rank here runs torch's
ring with its device's flash op and that op's own backward:

- ``sdpa-flash-cpu``: the CPU flash op through the templated ring (gloo ranks, and the fake CPU ranks of
  ``simulate.fake_ranks``); checked against one process in ``benchmarks/spike_cp_ranks.py``;
- ``sdpa-flash``: the CUDA flash op through torch's ``_scaled_dot_product_ring_flash_attention`` and its backward,
  the functions ``context_parallel`` dispatches that op to (``simulate.context_parallel``, on ``meta``).

The rotation (``allgather``: K/V all-gathered once per call; ``alltoall``: one neighbour's at a time) and the load
balance are torch's own options (``_cp_options``). The sequence is sharded by torch's ``_context_parallel_shard``
with its head-tail load balancer (rank ``r`` holds chunks ``r`` and ``2 cp - 1 - r`` of the causal sequence, so
every rank does the same attention work): tokens, targets and the positions, which the model takes so its rotary
or learned positions are the tokens' own (``positions`` of the GPT and Llama families' ``forward``).

Composition is torchtitan's: FSDP2 shards over the flattened ``dp_shard x cp`` mesh (every rank of a cp group holds
a shard of the weights, and gradients are averaged over all ``dp_shard x cp`` ranks, which holds equal token
counts per rank), tensor parallel inside each rank as without cp (``distributed.tensor_parallel``), HSDP replicas
of the cp group over ``(dp_replicate, dp_shard_cp)``. A block compiled per block (``compile.scope: block``) traces
the ring, forward and backward, without a graph break (``_cpu_flash_backward``;
reports/spike-compiled-cp-ranks.md).
"""

from __future__ import annotations

import contextlib

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.experimental._context_parallel import _attention as ring
from torch.distributed.tensor.experimental._context_parallel._load_balancer import _HeadTailLoadBalancer

from pytest_flashckpt.models import attention

ROTATIONS = ("allgather", "alltoall")
RING_BACKENDS = {"cpu": "sdpa-flash-cpu", "cuda": "sdpa-flash"}  # the flash op a ring runs with, by device type
_SEQ_DIM = 2  # (B, H, T, D): the dimension the ring splits and merges


class _RingFlashAttention(torch.autograd.Function):
    """One ring attention call: torch's ring forward with the flash op of ``backend``, and torch's ring backward
    with that op's backward, from what the flash op saves (q, k, v, out, logsumexp; the CUDA op's RNG state too)."""

    @staticmethod
    def forward(ctx, q, k, v, mesh: DeviceMesh, backend: str, dropout_p: float):
        ctx.mesh, ctx.backend, ctx.dropout_p = mesh, backend, dropout_p
        if backend == "sdpa-flash":
            out, lse, cum_q, cum_k, max_q, max_k, seed, offset, *_ = ring._scaled_dot_product_ring_flash_attention(
                mesh, q, k, v, dropout_p, True)
            ctx.save_for_backward(q, k, v, out, lse, cum_q, cum_k, seed, offset)
            ctx.max_q, ctx.max_k = max_q, max_k
            return out
        out, lse, *_ = ring._templated_ring_attention(
            mesh.get_group(), _SEQ_DIM, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu, q, k, v,
            is_causal=True, dropout_p=dropout_p)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        if ctx.backend == "sdpa-flash":
            q, k, v, out, lse, cum_q, cum_k, seed, offset = ctx.saved_tensors
            grad_q, grad_k, grad_v, *_ = ring._scaled_dot_product_ring_flash_attention_backward(
                ctx.mesh, grad_out, q, k, v, out, lse, cum_q, cum_k, ctx.max_q, ctx.max_k, ctx.dropout_p, True, seed,
                offset)
        else:
            q, k, v, out, lse = ctx.saved_tensors
            grad_q, grad_k, grad_v, *_ = ring._templated_ring_attention_backward(
                ctx.mesh.get_group(), _SEQ_DIM, _cpu_flash_backward, grad_out, "grad_out", q, k, v, out, lse,
                is_causal=True, dropout_p=ctx.dropout_p)
        return grad_q, grad_k, grad_v, None, None, None


def _cpu_flash_backward(*, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask=None, scale=None):
    """The CPU flash op's backward as torch's ring backward calls it (keywords), passed on positionally: the op's
    forward output is its argument named ``out``, which Dynamo takes for an ``out=`` tensor and breaks the graph at
    (4 breaks a step before; reports/spike-compiled-cp-ranks.md)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
        grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)


@contextlib.contextmanager
def ring_attention(mesh: DeviceMesh, rotation: str = "allgather", load_balanced: bool = True):
    """While active, the models' explicit flash ops (``models.attention``) run as torch's ring attention over the
    1D ``mesh`` (the cp ranks), with ``rotation`` and load balancing set in torch's own context-parallel options."""
    if rotation not in ROTATIONS:
        raise ValueError(f"context parallel rotation {rotation!r} is unknown; use one of {', '.join(ROTATIONS)}")
    explicit = attention._explicit_op
    options = ring._cp_options
    saved = (options.rotate_method, options.enable_load_balance)

    def ring_op(q, k, v, backend, dropout_p):
        if backend not in RING_BACKENDS.values():
            raise ValueError(f"context parallel runs the flash op of its device ({', '.join(RING_BACKENDS.values())}); "
                             f"the step ran {backend}")
        return _RingFlashAttention.apply(q, k, v, mesh, backend, dropout_p)

    ring.set_rotate_method(rotation)
    options.enable_load_balance = load_balanced
    attention._explicit_op = ring_op
    try:
        yield
    finally:
        attention._explicit_op = explicit
        options.rotate_method, options.enable_load_balance = saved


def ring_backend(device_type: str) -> str:
    """The explicit flash op a context-parallel rank of ``device_type`` runs (``RING_BACKENDS``)."""
    try:
        return RING_BACKENDS[device_type]
    except KeyError:
        raise ValueError(f"context parallel runs on {' or '.join(RING_BACKENDS)} ranks, not {device_type}") from None


def shard_sequence(mesh: DeviceMesh, tensors: list[torch.Tensor], load_balanced: bool = True) -> list[torch.Tensor]:
    """This cp rank's share of each (B, seq) tensor, by torch's ``_context_parallel_shard`` (with its head-tail load
    balancer where ``load_balanced``: chunks ``r`` and ``2 cp - 1 - r``)."""
    seq_len = tensors[0].size(1)
    balancer = _HeadTailLoadBalancer(seq_len, mesh.size(), tensors[0].device) if load_balanced else None
    return [t.contiguous() for t in ring._context_parallel_shard(mesh, tensors, [1] * len(tensors), balancer)]


def local_positions(mesh: DeviceMesh, seq_len: int, device: torch.device | str, load_balanced: bool = True) -> torch.Tensor:
    """The places in the sequence of the tokens this cp rank holds, (seq_len / cp,): sharded as ``shard_sequence``
    shards the tokens."""
    positions = torch.arange(seq_len, device=device).unsqueeze(0)
    return shard_sequence(mesh, [positions], load_balanced)[0][0]
