"""Tensor + sequence parallel, alone or under FSDP2 on a 2D mesh (dp_shard x tp), through torch's own API.

The plan is read from the model's anatomy (``models.anatomy``), not from parameter names guessed per family: the
q/k/v, gate and up projections column-wise, the o and down projections row-wise with their output reduce-scattered
to sequence shards, the norms sequence-parallel, the attention and MLP inputs all-gathered from the sequence shards
(``PrepareModuleInput``), the embedding row-wise to sequence shards, the head column-wise with its logits left
sharded over the vocabulary for ``loss_parallel`` (torchtitan's Llama plan). ``parallelize_module`` does the rest.

Composition follows torchtitan: TP first, then activation checkpointing (``apply_ac`` replaces block ``forward``
methods; the TP hooks sit on submodules and stay), then ``fully_shard`` per block and root over the mesh's
``dp_shard`` dimension, then the optimizer over the resulting DTensors.

Known limits, each an error naming it: a fused q/k/v projection (the GPT family's ``c_attn``) cannot be
column-sharded without giving a rank q of some heads and k/v of others (the model must split it first), and
learned absolute positions (``wpe``) are added to a sequence-sharded embedding they do not match.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from pytest_flashckpt.activation import AppliedActivation, apply_ac
from pytest_flashckpt.config.layout import Layout
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.distributed import context_parallel
from pytest_flashckpt.distributed.fsdp import ShardedTrainer, mixed_precision_policy
from pytest_flashckpt.distributed.memory import ShardedLiveTensorProbe
from pytest_flashckpt.models.anatomy import ModelAnatomy, get_anatomy, get_blocks
from pytest_flashckpt.models.cards import build_model

COLUMN_ROLES = ("q", "k", "v", "gate", "up")  # output features sharded: whole heads / MLP columns per rank
ROW_ROLES = ("o", "down")  # input features sharded: partial sums reduce-scattered to sequence shards


def make_mesh(layout: Layout, device_type: str = "cpu") -> DeviceMesh:
    """The 2D mesh (dp_shard, tp) of the current process group; a size-1 axis is kept so the plan is one shape.
    With context parallel, the 3D mesh (dp_shard, cp, tp) and its flattened ``dp_shard_cp`` dimension, which FSDP2
    shards over (torchtitan's mesh; ``distributed.context_parallel``). With HSDP replicas, the 3D mesh
    (dp_replicate, dp_shard, tp), FSDP2 over its 2D ``(dp_replicate, dp_shard)`` submesh (torch's HSDP); with both,
    the 4D mesh (dp_replicate, dp_shard, cp, tp), FSDP2 over ``(dp_replicate, dp_shard_cp)``: replicas of the
    group that shards over ``dp_shard x cp`` (torchtitan's ``dp_replicate`` x ``dp_shard_cp``)."""
    if layout.pp > 1:
        raise ValueError(f"layout {layout.describe()}: tensor parallel is composed with dp_shard and cp here; pipeline "
                         "stages are distributed.pipeline's")
    return layout_mesh(layout, device_type)


def layout_mesh(layout: Layout, device_type: str = "cpu", outer: tuple[str, ...] = ()) -> DeviceMesh:
    """The mesh of ``layout``'s axes, outermost first: ``outer`` (a pipeline's ``pp``), ``dp_replicate`` and ``cp``
    where above 1, ``dp_shard`` and ``tp`` always; with ``cp``, holding the mesh FSDP2 shards over
    (``_keep_fsdp_mesh``). ``make_mesh`` and ``distributed.pipeline.make_mesh`` build theirs here."""
    names = (*outer, *(("dp_replicate",) if layout.dp_replicate > 1 else ()), "dp_shard",
             *(("cp",) if layout.cp > 1 else ()), "tp")
    mesh = init_device_mesh(device_type, tuple(getattr(layout, name) for name in names), mesh_dim_names=names)
    return _keep_fsdp_mesh(mesh) if layout.cp > 1 else mesh


def _keep_fsdp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """``mesh`` (with a ``cp`` dimension, and ``dp_replicate`` or not) holding the mesh FSDP2 shards over, which
    ``fsdp_mesh`` returns: the flattened ``dp_shard_cp`` (torch asks callers to keep a flattened mesh themselves:
    slicing it from the root is deprecated), beside the replicas as one 2D view of the same ranks with HSDP (torch's
    ``DeviceMesh._concatenate``; the ranks of each dimension are the root mesh's, no new rank order). Outer
    dimensions (a pipeline's ``pp``) are not flattened in: each pipeline rank's stages shard over their own group."""
    shards = mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
    replicated = "dp_replicate" in (mesh.mesh_dim_names or ())
    setattr(mesh, _FSDP_MESH, DeviceMesh._concatenate([mesh["dp_replicate"], shards]) if replicated else shards)
    return mesh


_FSDP_MESH = "_flashckpt_fsdp_mesh"  # where make_mesh keeps a cp mesh's FSDP mesh (flattened dp_shard x cp)


def fsdp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The mesh FSDP2 shards over: ``dp_shard``, the flattened ``dp_shard_cp`` of ``make_mesh`` where the mesh has
    context parallel, the 2D ``(dp_replicate, dp_shard)`` where it has HSDP replicas (FSDP2 replicates over the
    first dimension and shards over the second), or ``(dp_replicate, dp_shard_cp)`` with both."""
    kept = getattr(mesh, _FSDP_MESH, None)
    if kept is not None:
        return kept
    if "dp_replicate" in (mesh.mesh_dim_names or ()):
        return mesh["dp_replicate", "dp_shard"]
    return mesh["dp_shard"]


def data_rank(mesh: DeviceMesh) -> tuple[int, int]:
    """This rank's place among the data-parallel ranks and their count: ``(rank, world)`` over ``dp_shard``, or over
    ``dp_replicate x dp_shard`` with HSDP replicas (each replica reads its own rows, as FSDP over both would)."""
    shard = mesh["dp_shard"]
    if "dp_replicate" not in (mesh.mesh_dim_names or ()):
        return shard.get_local_rank(), shard.size()
    replicate = mesh["dp_replicate"]
    return replicate.get_local_rank() * shard.size() + shard.get_local_rank(), replicate.size() * shard.size()


def _gather_sequence(n_args: int) -> PrepareModuleInput:
    """All-gather the first input from sequence shards (the 3-D activation); further inputs (rotary tables) pass."""
    rest = (None,) * (n_args - 1)
    return PrepareModuleInput(input_layouts=(Shard(1), *rest), desired_input_layouts=(Replicate(), *rest))


def _attention_inputs(model: nn.Module, anatomy: ModelAnatomy) -> int:
    """How many positional inputs the attention module takes (Llama: x, cos, sin; GPT: x)."""
    block = get_blocks(model)[0]
    attention = block.get_submodule(anatomy.block.attention)
    code = type(attention).forward.__code__
    return code.co_argcount - 1


def block_plan(model: nn.Module) -> dict[str, ParallelStyle]:
    """The per-block plan (module path relative to a block -> style), from the block anatomy."""
    anatomy = get_anatomy(model)
    roles = anatomy.block.projections
    if "qkv" in roles:
        raise ValueError(
            f"tensor parallel: the {anatomy.family} block's fused q/k/v projection {roles['qkv']!r} cannot be "
            "column-sharded without mixing heads of q, k and v on a rank; use a family with separate q/k/v "
            "projections (llama) or tp 1"
        )
    plan: dict[str, ParallelStyle] = {norm: SequenceParallel() for norm in anatomy.block.norms}
    plan[anatomy.block.attention] = _gather_sequence(_attention_inputs(model, anatomy))
    mlp_parents = {roles[r].rpartition(".")[0] for r in ("gate", "up", "down") if r in roles}
    for parent in sorted(p for p in mlp_parents if p):
        plan[parent] = _gather_sequence(1)
    for role in COLUMN_ROLES:
        if role in roles:
            plan[roles[role]] = ColwiseParallel()
    for role in ROW_ROLES:
        if role in roles:
            plan[roles[role]] = RowwiseParallel(output_layouts=Shard(1))
    return plan


def root_plan(model: nn.Module) -> dict[str, ParallelStyle]:
    """Embedding, final norm and head: tokens in replicated, sequence shards through the stack, vocabulary-sharded
    logits out (``loss_parallel`` computes the cross-entropy on them without gathering the vocabulary)."""
    anatomy = get_anatomy(model)
    if len(anatomy.embeddings) != 1:
        raise ValueError(
            f"tensor parallel: the {anatomy.family} model adds {len(anatomy.embeddings)} embeddings "
            f"({', '.join(anatomy.embeddings)}); learned positions do not match a sequence-sharded token embedding "
            "(use a family with rotary positions: llama)"
        )
    plan: dict[str, ParallelStyle] = {
        anatomy.embeddings[0]: RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
    }
    if anatomy.final_norm:
        plan[anatomy.final_norm] = SequenceParallel()
    if anatomy.head:
        plan[anatomy.head] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)
    return plan


def plan_refusal(card) -> str | None:
    """Why ``card``'s family cannot be tensor-parallel (its block or root plan refused, read off the model built on
    ``meta``: nothing is allocated), or None. What a suite's preflight and ``flashckpt simulate --tp`` check before
    anything runs."""
    model = build_model(card, "sdpa", "meta")
    try:
        block_plan(model)
        root_plan(model)
    except ValueError as exc:
        return str(exc)
    return None


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """``parallelize_module`` with the root and per-block plans; a tied head is tied again afterwards (both sides
    are sharded over the vocabulary, ``Shard(0)``, so the tie holds shard for shard)."""
    anatomy = get_anatomy(model)
    blocks_plan = block_plan(model)
    parallelize_module(model, tp_mesh, root_plan(model))
    for block in get_blocks(model):
        parallelize_module(block, tp_mesh, blocks_plan)
    for alias, owner in anatomy.tied:
        alias_module, _, alias_name = alias.rpartition(".")
        setattr(model.get_submodule(alias_module), alias_name, model.get_parameter(owner))


def settle_embedding_output(model: nn.Module) -> None:
    """Before the blocks of a tensor-parallel model are compiled: the token embedding's output, which
    ``RowwiseParallel`` reduce-scatters asynchronously and hands on as an ``AsyncCollectiveTensor`` (the local shard
    of a collective still in flight), is waited for in eager by a copy at the embedding's output (a forward hook,
    outside every compiled region), so the first compiled block takes a plain tensor.

    Why: with an ``AsyncCollectiveTensor`` as its input, the compiled block's backward (AOTAutograd, measured with
    the ``aot_eager`` backend too: not Inductor's) hands the embedding's redistribution a plain gradient of the
    global shape, and torch's ``Redistribute.backward`` raises ``'Tensor' object has no attribute '_local_tensor'``;
    waiting inside the compiled block instead runs, but the embedding's gradient is then None (the weight would
    never train). The copy is one activation of the rank's sequence shard, freed when the first block has read it
    (reports/spike-compiled-layouts.md compares the compiled loss with the eager one)."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    def settle(module: nn.Module, inputs, output):
        return output.clone() if isinstance(output, AsyncCollectiveTensor) else output

    model.get_submodule(get_anatomy(model).embeddings[0]).register_forward_hook(settle)


def parallelize(
    model: nn.Module,
    mesh: DeviceMesh,
    activation: ActivationConfig | None = None,
    mp_policy: MixedPrecisionPolicy | None = None,
    before_shard: Callable[[nn.Module], None] | None = None,
) -> AppliedActivation:
    """TP on ``mesh["tp"]`` (when it has more than one rank), then the activation strategy, then ``before_shard``
    (a compiled scenario compiles each block there), then ``fully_shard`` per block and root on ``fsdp_mesh(mesh)``
    (when it has more than one rank, or for mixed precision, which is FSDP2's ``MixedPrecisionPolicy``):
    torchtitan's order."""
    if mesh["tp"].size() > 1:
        apply_tp(model, mesh["tp"])
    applied = apply_ac(model, activation or ActivationConfig())
    if before_shard is not None:
        before_shard(model)
    shard_mesh = fsdp_mesh(mesh)
    if shard_mesh.size() > 1 or mp_policy is not None:
        kwargs = {"mesh": shard_mesh} | ({} if mp_policy is None else {"mp_policy": mp_policy})
        for block in get_blocks(model):
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
    return applied


@dataclass
class ParallelTrainer(ShardedTrainer):
    """A trainer on a dp_shard x tp layout: the batch is the data-parallel rank's share (every TP rank of a group
    reads the same rows) and the loss is computed with ``loss_parallel`` on vocabulary-sharded logits (forward
    and backward inside it, as torch requires)."""

    tensor_parallel: bool = False
    context_mesh: DeviceMesh | None = None  # the cp ranks sharing this rank's sequences (context parallel), or None

    def batch(self, position: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The data-parallel rank's rows; under context parallel, this cp rank's share of their tokens."""
        x, y = super().batch(position)
        if self.context_mesh is None:
            return x, y
        x, y = context_parallel.shard_sequence(self.context_mesh, [x, y])
        return x, y

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The model's loss; under context parallel with the positions of the tokens this rank holds (the same
        sharding as ``batch``'s)."""
        if self.context_mesh is None:
            return super().loss(x, y)
        positions = context_parallel.local_positions(self.context_mesh, self.seq_len, x.device)
        return self.model(x, y, positions=positions)

    def loss_context(self):
        """``step_context`` of this trainer's layout."""
        return step_context(self.tensor_parallel, self.context_mesh)

    def train_step(self) -> torch.Tensor:
        with self.loss_context():
            return super().train_step()


def step_context(tensor_parallel: bool, context_mesh: DeviceMesh | None) -> contextlib.ExitStack:
    """What a laid-out step's forward and backward run under: ``loss_parallel()`` under TP (the head leaves the
    logits sharded) and torch's ring attention over ``context_mesh`` under context parallel, else nothing. The
    one-process rank (``ParallelTrainer``) and the pipeline's stages (``distributed.pipeline``) enter the same."""
    stack = contextlib.ExitStack()
    if tensor_parallel:
        stack.enter_context(loss_parallel())
    if context_mesh is not None:
        stack.enter_context(context_parallel.ring_attention(context_mesh))
    return stack


def build_trainer(
    card,
    layout: Layout,
    mesh: DeviceMesh,
    *,
    batch_size: int,
    seq_len: int,
    seed: int = 0,
    backend: str = "sdpa",
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    activation: ActivationConfig | None = None,
    precision: str = "pure",
    model: nn.Module | None = None,
    foreach: bool | None = None,
    before_shard: Callable[[nn.Module], None] | None = None,
) -> tuple[ParallelTrainer, AppliedActivation]:
    """The same initial weights at every layout (built whole from ``seed``, then laid out). ``model``: an already
    built one (the simulated rank builds it under fake mode). ``before_shard``: as ``parallelize``'s. Layout checks
    run before anything is built."""
    layout.check_card(card)
    layout.check_batch(batch_size)
    layout.check_sequence(seq_len)
    mixed = precision == "mixed"
    if model is None:
        if layout.cp > 1:  # the ring runs the device's explicit flash op (distributed.context_parallel)
            backend = context_parallel.ring_backend(torch.device(device).type)
        model = build_model(card, backend, device, torch.float32 if mixed else dtype, seed=seed)
    applied = parallelize(model, mesh, activation, mixed_precision_policy(dtype) if mixed else None, before_shard)
    trainer = ParallelTrainer.create(model, batch_size, seq_len, seed=seed, foreach=foreach)  # foreach: AdamW's (None: torch's pick)
    trainer.rank, trainer.world_size = data_rank(mesh)
    trainer.tensor_parallel = layout.tp > 1
    trainer.context_mesh = mesh["cp"] if layout.cp > 1 else None
    return trainer, applied


def _local(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.to_local() if isinstance(t, DTensor) else t for t in tensors]


def forward_backward(trainer: ParallelTrainer) -> torch.Tensor:
    """One forward and backward on the trainer's next batch (inside ``loss_parallel`` under TP); the loss."""
    x, y = trainer.batch()
    with trainer.loss_context():
        loss = trainer.loss(x, y)
        loss.backward()
    return loss.detach()


def optimizer_step(trainer: ParallelTrainer) -> None:
    trainer.optimizer.step()
    trainer.scheduler.step()
    trainer.optimizer.zero_grad(set_to_none=True)


def memory_step(trainer: ParallelTrainer, device_type: str = "cpu",
                probe_class: type[ShardedLiveTensorProbe] = ShardedLiveTensorProbe) -> dict[str, int]:
    """One training step in the two windows of ``distributed.rank`` (forward + backward, then the optimizer),
    counted by the rank probe: DTensors as their local shards. The same function measures a gloo rank and the
    simulated (fake) rank, so the two differ only in the engine's process group and tensor mode (and, where given,
    ``probe_class``: a rank probe that reads the same bytes faster, ``simulate.rank_probe``)."""
    trainer.model.train()
    with probe_class(device_type).track(resident=_local(trainer.state_tensors())) as fwd_bwd:
        forward_backward(trainer)
    grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
    with probe_class(device_type).track(resident=_local(trainer.state_tensors() + grads)) as opt:
        optimizer_step(trainer)
    trainer.step += 1
    return {
        "peak_bytes": max(fwd_bwd.peak_bytes, opt.peak_bytes),
        "fwd_bwd_start_bytes": fwd_bwd.start_bytes,
        "fwd_bwd_peak_bytes": fwd_bwd.peak_bytes,
        "optimizer_start_bytes": opt.start_bytes,
        "optimizer_peak_bytes": opt.peak_bytes,
        "largest_allgather_bytes": int(fwd_bwd.extra.get("largest_allgather_bytes", 0)),
    }
