"""Pipeline stages through torch's ``torch.distributed.pipelining``: the model's blocks split into stages, each
stage a ``PipelineStage``, run by ``ScheduleGPipe``, ``Schedule1F1B`` or ``ScheduleInterleaved1F1B``.

The split reads the model's anatomy (``models.anatomy``), not a family's field names: the blocks container is cut
into consecutive ranges, the first stage keeps the embedding, the last the final norm and the head, and every
stage runs the family's own forward on its part (torchtitan cuts its models the same way, by deleting what a
stage does not hold). On a stage that is not first, the embedding is replaced by ``_Received``, which hands the
forward the previous stage's hidden states, so what the family computes between embedding and blocks (Llama's
rotary tables) is computed on every stage as in one process; on a stage that is not last the final norm and the
head are ``nn.Identity`` and the forward (without targets) returns the hidden states. The last stage returns the
logits and ``loss_fn`` is the families' next-token cross-entropy (the mean, as ``model(x, y)``); the schedules
scale the accumulated gradients by the microbatch count (``scale_grads``), so they equal the full batch's.

Composition: the stage split, then the activation strategy per stage (``apply_ac``), then ``fully_shard`` per
block and stage on the mesh's ``dp_shard`` dimension (with ``reshard_after_forward=False``, torchtitan's default
under pipelining: a block is not all-gathered again for every microbatch), then AdamW over the stage's
parameters. Tensor parallel inside a stage (``tp`` > 1 on the ``(pp, dp_shard, tp)`` mesh) comes first, as in
one process (``distributed.tensor_parallel``): the family's block plan on every block of the stage, and the root
plan's entries for what the stage holds (the embedding row-wise to sequence shards on the first stage; the final
norm sequence-parallel and the head column-wise with vocabulary-sharded DTensor logits on the last, the loss under
``loss_parallel``, torchtitan's composition). Between stages flows the local sequence shard of the hidden states,
(rows, T / tp, C); a stage that is not first builds its rotary tables for the whole sequence (``StageModule``), as
the attention's inputs are all-gathered to it. Context parallel inside the stages (``cp`` > 1 on the
``(pp, dp_shard, cp, tp)`` mesh) is torchtitan's composition too: every stage's blocks run torch's ring attention
(``distributed.context_parallel``) over the cp ranks of its pipeline rank, the tokens and targets are this cp
rank's share (head-tail load balanced), every stage is given those tokens' positions for the step
(``PipelineTrainer.step_context``), between stages flows the cp rank's share of the hidden states, and FSDP2
shards each stage over the flattened ``dp_shard x cp``. Every stage is given its input and output shapes (``StageShapes``), so torch's schedule runs in its
static mode.

Measured on gloo ranks at pp 2 (world 2) and dp_shard 2 x pp 2 (world 4; tests/distributed/test_pipeline.py):
GPipe, 1F1B and interleaved 1F1B (2 stages per rank) give one process's loss and gradients (max |difference|
1.9e-8), each rank's CPU allocator added what its probe added, to the byte, and the rank simulated under fake
mode (``simulate.pipeline``) holds the same bytes in every window. At pp 2 x tp 2 (world 4) the three schedules
give one process's loss and gradients too, and so do dp_shard 2 x pp 2 x tp 2 (world 8: FSDP2 over the stages'
tensor-parallel DTensors; the mean of the replicas' losses is the batch's), each rank's simulated twin equal to it
to the byte at every window's start and the optimizer peak (tests/distributed/test_pipeline_tp.py).

Limits, each an error naming it: a head tied to the embedding cannot be split over two stages (the two would
live on different ranks); a model with more than one embedding (GPT's learned positions) is refused, as under
tensor parallel; stages are not more than blocks (``config.layout``).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import parallelize_module

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.config.layout import Layout, PipelineSchedule
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.distributed import context_parallel
from pytest_flashckpt.distributed import tensor_parallel as tp
from pytest_flashckpt.distributed.memory import ShardedLiveTensorProbe
from pytest_flashckpt.models.anatomy import ModelAnatomy, get_anatomy, get_blocks
from pytest_flashckpt.training import _warmup, make_batch, make_optimizer, rank_rows

SCHEDULE_CLASSES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B}


def make_mesh(layout: Layout, device_type: str = "cpu") -> DeviceMesh:
    """The (pp, dp_shard, tp) mesh of the current process group: pipeline outermost, tensor parallel innermost, as
    torchtitan; a size-1 axis is kept so the stage build is one shape. Rank ``r`` is pipeline rank
    ``r // (dp_replicate * dp_shard * cp * tp)``. With HSDP replicas, (pp, dp_replicate, dp_shard, tp): FSDP2 over the
    stage's 2D ``(dp_replicate, dp_shard)`` submesh; with context parallel, (pp, dp_shard, cp, tp): FSDP2 over the
    stage group's flattened ``dp_shard_cp`` (``tensor_parallel.layout_mesh``, ``fsdp_mesh``)."""
    return tp.layout_mesh(layout, device_type, outer=("pp",))


def stage_ranges(n_blocks: int, n_stages: int) -> list[range]:
    """Consecutive block ranges, one per stage, as even as the count allows (the first stages take one more)."""
    if not 1 <= n_stages <= n_blocks:
        raise ValueError(f"pipeline: {n_stages} stages for {n_blocks} blocks; use 1 to {n_blocks} stages")
    size, extra = divmod(n_blocks, n_stages)
    ranges, start = [], 0
    for stage in range(n_stages):
        stop = start + size + (stage < extra)
        ranges.append(range(start, stop))
        start = stop
    return ranges


def stages_of_rank(pp_rank: int, pp: int, stages_per_rank: int) -> list[int]:
    """The stage indices pipeline rank ``pp_rank`` holds: ``pp_rank``, ``pp_rank + pp``, ... (torch's loop order)."""
    return [pp_rank + k * pp for k in range(stages_per_rank)]


class _Received(nn.Module):
    """Stands in for the embedding on a stage that is not first: returns the hidden states the stage received."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden: torch.Tensor | None = None

    def forward(self, _tokens: torch.Tensor) -> torch.Tensor:
        hidden, self.hidden = self.hidden, None  # not kept past the forward: the autograd graph holds what it needs
        return hidden


class StageModule(nn.Module):
    """One pipeline stage: the model trimmed to its blocks (``part``) and the family's forward run on it.

    ``names`` maps this stage's parameter names to the whole model's (``part.blocks.0.x`` -> ``blocks.4.x``), so a
    stage's gradients and checkpoints read against one process. ``sequence_shards``: the tensor-parallel ranks the
    received hidden states' sequence is sharded over (``apply_stage_tp``; 1 without tensor parallel)."""

    def __init__(self, part: nn.Module, index: int, n_stages: int, names: dict[str, str]) -> None:
        super().__init__()
        self.part = part
        self.index, self.n_stages, self.names = index, n_stages, names
        self._received = part.get_submodule(get_anatomy(part).embeddings[0]) if index > 0 else None
        self.sequence_shards = 1
        self.positions: torch.Tensor | None = None  # context parallel: the places of this cp rank's tokens

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.n_stages - 1

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """First stage: token ids (B, T) in; other stages: the previous stage's hidden states (B, T / tp, C) in
        (their local sequence shard under tensor parallel). Out: hidden states, or the logits on the last stage."""
        where = {} if self.positions is None else {"positions": self.positions}
        if self._received is None:
            return self.part(inputs, **where)
        self._received.hidden = inputs
        # the family's forward reads batch, sequence and device off its token ids: an 8-byte zero, expanded to the
        # whole sequence (under tensor parallel its rotary tables are the whole sequence's, as in one process; under
        # context parallel the cp rank's share, at its tokens' own positions)
        rows, local_seq = inputs.shape[:2]
        tokens = torch.zeros((), dtype=torch.long, device=inputs.device).expand(rows, local_seq * self.sequence_shards)
        return self.part(tokens, **where)


def _check_splittable(anatomy: ModelAnatomy, n_stages: int) -> None:
    if n_stages == 1:
        return
    if anatomy.tied:
        alias, owner = anatomy.tied[0]
        raise ValueError(
            f"pipeline: the {anatomy.family} model ties {alias} to {owner}; the first and last stages live on "
            "different ranks, so the tie cannot hold; use an untied card (tie_word_embeddings: false) or pp 1"
        )
    if len(anatomy.embeddings) != 1:
        raise ValueError(
            f"pipeline: the {anatomy.family} model adds {len(anatomy.embeddings)} embeddings "
            f"({', '.join(anatomy.embeddings)}); a stage that is not first receives hidden states in their place "
            "(use a family with one embedding and rotary positions: llama)"
        )


def split_stage(model: nn.Module, index: int, n_stages: int) -> StageModule:
    """Stage ``index`` of ``n_stages``: ``model`` holding only that stage's blocks, the embedding on the first stage
    and the final norm and head on the last. ``model`` itself is left whole; the stage shares its modules (no
    copy: under fake mode a copy of a 70B card would cost time, and the whole model is dropped once split)."""
    anatomy = get_anatomy(model)
    _check_splittable(anatomy, n_stages)
    blocks = get_blocks(model, anatomy)
    kept = stage_ranges(len(blocks), n_stages)[index]
    part = _shallow(model)
    container = model.get_submodule(anatomy.blocks)
    if isinstance(container, nn.ModuleDict):
        keys = list(container.keys())
        stage_container: nn.Module = nn.ModuleDict({keys[i]: container[keys[i]] for i in kept})
        block_names = {keys[i]: keys[i] for i in kept}
    else:
        stage_container = nn.ModuleList(blocks[i] for i in kept)
        block_names = {str(j): str(i) for j, i in enumerate(kept)}
    _set_shallow(part, anatomy.blocks, stage_container)
    if index > 0:
        _set_shallow(part, anatomy.embeddings[0], _Received())
    if index < n_stages - 1:
        for path in (anatomy.final_norm, anatomy.head):
            if path:
                _set_shallow(part, path, nn.Identity())
    prefix = anatomy.blocks + "."
    names = {}
    for name, _ in part.named_parameters():
        full = name
        if name.startswith(prefix):
            local, _, rest = name[len(prefix):].partition(".")
            full = f"{prefix}{block_names[local]}.{rest}"
        names[f"part.{name}"] = full
    return StageModule(part, index, n_stages, names)


def _shallow(module: nn.Module) -> nn.Module:
    """A copy of ``module`` with its own dicts of submodules, parameters and buffers (their values shared)."""
    twin = copy.copy(module)
    for key in ("_modules", "_parameters", "_buffers"):
        setattr(twin, key, dict(getattr(module, key)))
    return twin


def _set_shallow(model: nn.Module, path: str, module: nn.Module) -> None:
    """Replace ``path`` in ``model`` without touching the module it was shared with: every parent on the path is
    copied first (``_shallow``; a dotted path such as ``model.layers`` in a Hugging Face model)."""
    parts = path.split(".")
    parent = model
    for name in parts[:-1]:
        parent._modules[name] = parent = _shallow(parent._modules[name])
    parent._modules[parts[-1]] = module


def stage_plan(stage: StageModule) -> dict[str, object]:
    """The root plan of ``stage`` (``tensor_parallel.root_plan``'s entries for what it holds): the embedding on the
    first stage, the final norm and the head (vocabulary-sharded DTensor logits) on the last."""
    anatomy = get_anatomy(stage.part)
    held = set(anatomy.embeddings[:1]) if stage.is_first else set()
    if stage.is_last:
        held |= {path for path in (anatomy.final_norm, anatomy.head) if path}
    return {path: style for path, style in tp.root_plan(stage.part).items() if path in held}


def apply_stage_tp(stage: StageModule, tp_mesh: DeviceMesh, root: dict[str, object] | None = None) -> None:
    """Tensor + sequence parallel inside ``stage`` with torch's ``parallelize_module``: its root plan (``root``, by
    default ``stage_plan``), then the family's block plan on each of its blocks (``tensor_parallel.block_plan``)."""
    blocks_plan = tp.block_plan(stage.part)
    parallelize_module(stage.part, tp_mesh, stage_plan(stage) if root is None else root)
    for block in get_blocks(stage.part):
        parallelize_module(block, tp_mesh, blocks_plan)
    stage.sequence_shards = tp_mesh.size()


@dataclass(frozen=True)
class StageShapes:
    """What flows between stages, so every ``PipelineStage`` is given its input and output metadata
    (``input_args`` / ``output_args``) and torch's schedule runs in its static mode: no metadata exchange at the
    first step, and the same code on a gloo rank and on a simulated one (whose fake peers send nothing)."""

    width: int
    vocab: int
    dtype: torch.dtype

    @classmethod
    def of(cls, model: nn.Module) -> "StageShapes":
        anatomy = get_anatomy(model)
        embedding = model.get_submodule(anatomy.embeddings[0]).weight
        head = model.get_submodule(anatomy.head).weight
        return cls(width=embedding.shape[1], vocab=head.shape[0], dtype=embedding.dtype)

    def stage_args(self, stage: StageModule, rows: int, seq_len: int, dtype: torch.dtype,
                   tp_mesh: DeviceMesh | None = None) -> dict:
        """One microbatch's input and output of ``stage``, as meta tensors (shapes, dtypes, and which carry a
        gradient: hidden states and logits do, token ids do not). Under tensor parallel (``tp_mesh`` of more than
        one rank) the hidden states are the local sequence shard (rows, T / tp, C) and the last stage's logits a
        DTensor sharded over the vocabulary (rows, T, V / tp local), what its head returns."""
        shards = 1 if tp_mesh is None else tp_mesh.size()  # (seq_len: a cp rank's share under context parallel)
        hidden = torch.empty(rows, seq_len // shards, self.width, dtype=dtype, device="meta", requires_grad=True)
        tokens = torch.empty(rows, seq_len, dtype=torch.long, device="meta")
        logits = torch.empty(rows, seq_len, self.vocab // shards, dtype=dtype, device="meta", requires_grad=True)
        if shards > 1:
            logits = DTensor.from_local(logits, tp_mesh, [Shard(2)], run_check=False)
        return {"input_args": tokens if stage.is_first else hidden, "output_args": logits if stage.is_last else hidden}


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The families' loss on the last stage's logits: mean cross-entropy over every position (``model(x, y)``)."""
    return F.cross_entropy(logits.flatten(0, 1), targets.reshape(-1))


@dataclass
class PipelineTrainer:
    """This rank's stages, their torch ``PipelineStage`` objects and schedule, and AdamW over their parameters.

    The batch is the data-parallel rank's rows of the global batch (``make_batch``: the same data at every layout);
    the first stage feeds the tokens, the last the targets, every rank calls the schedule's ``step``."""

    stages: list[StageModule]
    schedule: object
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    vocab_size: int
    batch_size: int
    seq_len: int
    seed: int = 0
    dp_rank: int = 0
    dp_size: int = 1
    step: int = 0
    losses: list[torch.Tensor] = field(default_factory=list)
    tensor_parallel: bool = False  # the stages are tensor parallel: the schedule runs under ``loss_parallel``
    context_mesh: DeviceMesh | None = None  # context parallel: the cp ranks sharing this rank's sequences
    activation: str = ""  # what the activation strategy wrapped, per stage (``AppliedActivation.describe``)
    _view: nn.Module | None = field(default=None, repr=False)

    @property
    def model(self) -> nn.Module:
        """This rank's stages under the whole model's names (``checkpoint_view``): what a sharded checkpoint
        saves and loads (``distributed.sharded_store``), so a checkpoint of the stages loads into any layout."""
        if self._view is None:
            self._view = checkpoint_view(self.stages)
        return self._view

    @property
    def has_first(self) -> bool:
        return any(s.is_first for s in self.stages)

    @property
    def has_last(self) -> bool:
        return any(s.is_last for s in self.stages)

    def batch(self, position: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        device = next(self.stages[0].parameters()).device
        x, y = make_batch(self.vocab_size, self.batch_size, self.seq_len, self.seed,
                          self.step if position is None else position, device)
        x, y = rank_rows((x, y), self.dp_rank, self.dp_size)
        if self.context_mesh is not None:  # this cp rank's share of the tokens (context_parallel.shard_sequence)
            x, y = context_parallel.shard_sequence(self.context_mesh, [x, y])
        return x, y

    def parameters(self) -> list[nn.Parameter]:
        return [p for stage in self.stages for p in stage.parameters()]

    def state_tensors(self) -> list[torch.Tensor]:
        """Parameters and optimizer state of this rank's stages (what stays alive between steps)."""
        tensors = list(self.parameters())
        for state in self.optimizer.state.values():
            tensors.extend(v for v in state.values() if isinstance(v, torch.Tensor))
        return tensors

    def forward_backward(self) -> torch.Tensor | None:
        """One schedule step (every microbatch forward and backward); the mean microbatch loss on the last stage."""
        x, y = self.batch()
        self.losses = []
        args = (x,) if self.has_first else ()
        target = y if self.has_last else None
        with self.step_context():
            # return_outputs=False: the trainer needs the losses only; torch's default keeps every microbatch's
            # output (the logits) alive on the last stage until the step ends (pytorch/pytorch#159251)
            self.schedule.step(*args, target=target, losses=self.losses if self.has_last else None,
                               return_outputs=False)
        if not self.losses:
            return None
        # under loss_parallel each microbatch's loss is a replicated DTensor: its local value is the loss
        loss = torch.stack([_local(loss.detach()) for loss in self.losses]).mean()
        self.losses = []
        return loss

    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    @contextlib.contextmanager
    def step_context(self):
        """Around the schedule's step: ``loss_parallel`` under tensor parallel; under context parallel torch's ring
        attention and every stage given this cp rank's token positions (made here, in the step, as a one-process
        cp rank makes them in its loss)."""
        with tp.step_context(self.tensor_parallel, self.context_mesh) as stack:
            if self.context_mesh is not None:
                device = next(self.stages[0].parameters()).device
                positions = context_parallel.local_positions(self.context_mesh, self.seq_len, device)
                for stage in self.stages:
                    stage.positions = positions
                stack.callback(lambda: [setattr(stage, "positions", None) for stage in self.stages])
            yield

    def train_step(self) -> torch.Tensor | None:
        loss = self.forward_backward()
        self.optimizer_step()
        self.step += 1
        return loss


def checkpoint_view(stages: list[StageModule]) -> nn.Module:
    """A module holding the stages' modules at their paths in the whole model (``StageModule.names``): each
    parameter's owning module registered where the whole model has it (``blocks.4.attn`` for a stage's
    ``part.blocks.0.attn``), empty containers between, nothing copied. torch's ``get_state_dict`` on it gives the
    whole model's FQNs, so the stages of every pipeline rank write disjoint keys of one checkpoint, and a one-process
    or FSDP model reads them by its own names."""
    root = nn.Module()
    for stage in stages:
        for local, whole in stage.names.items():
            owner = stage.get_submodule(local.rpartition(".")[0])
            *parents, leaf = whole.rpartition(".")[0].split(".")
            node = root
            for name in parents:
                if name not in node._modules:
                    node.add_module(name, nn.Module())
                node = node._modules[name]
            if leaf not in node._modules:
                node.add_module(leaf, owner)
    held = {name for name, _ in root.named_parameters()}
    wanted = {whole for stage in stages for whole in stage.names.values()}
    if held != wanted:  # (a module owning parameters beside children that another path registered first)
        raise ValueError(f"pipeline checkpoint view: {sorted(held ^ wanted)[:3]} do not sit at the whole model's names")
    return root


def _schedule(stages: list[PipelineStage], pipeline: PipelineSchedule):
    cls = SCHEDULE_CLASSES[pipeline.schedule]
    if pipeline.schedule in ("gpipe", "1f1b"):
        return cls(stages[0], n_microbatches=pipeline.microbatches, loss_fn=next_token_loss)
    return cls(stages, n_microbatches=pipeline.microbatches, loss_fn=next_token_loss)


def build_pipeline(
    model: nn.Module,
    layout: Layout,
    mesh: DeviceMesh,
    pipeline: PipelineSchedule,
    *,
    batch_size: int,
    seq_len: int,
    seed: int = 0,
    activation: ActivationConfig | None = None,
    mp_policy: MixedPrecisionPolicy | None = None,
    device: torch.device | str = "cpu",
    before_shard: Callable[[nn.Module], None] | None = None,
) -> PipelineTrainer:
    """This rank's stages of ``model`` (built whole, the same weights at every layout), laid out and scheduled.
    ``model`` is consumed: its stages own copies of their parameters. ``before_shard`` (a compiled scenario's block
    compile) is called on each stage's part after its activation strategy and before ``fully_shard``."""
    pipeline.check(layout, batch_size=batch_size, n_blocks=len(get_blocks(model)))
    layout.check_batch(batch_size)
    n_stages = layout.pp * pipeline.stages_per_rank
    shapes = StageShapes.of(model)
    if layout.tp > 1:
        layout.check_card(model.config)
    layout.check_sequence(seq_len)
    layout.check_stage_shards(seq_len, shapes.vocab)
    pp_rank = mesh["pp"].get_local_rank()
    dp_mesh, tp_mesh = tp.fsdp_mesh(mesh), mesh["tp"]  # FSDP2's mesh: dp_shard, or (dp_replicate, dp_shard)
    dp_rank, dp_size = tp.data_rank(mesh)
    stages = [split_stage(model, index, n_stages) for index in stages_of_rank(pp_rank, layout.pp, pipeline.stages_per_rank)]
    del model
    applied = []
    for stage in stages:
        if tp_mesh.size() > 1:  # TP first, then activation checkpointing, then FSDP (torchtitan's order)
            apply_stage_tp(stage, tp_mesh)
        applied.append(f"stage {stage.index}: {apply_ac(stage.part, activation or ActivationConfig()).describe()}")
        if before_shard is not None:
            before_shard(stage.part)
        if dp_mesh.size() > 1 or mp_policy is not None:
            kwargs = {"mesh": dp_mesh, "reshard_after_forward": layout.pp == 1}
            kwargs |= {} if mp_policy is None else {"mp_policy": mp_policy}
            for block in get_blocks(stage.part):
                fully_shard(block, **kwargs)
            fully_shard(stage, **kwargs)
    group = mesh["pp"].get_group()
    rows = batch_size // dp_size // pipeline.microbatches
    dtype = mp_policy.param_dtype if mp_policy is not None and mp_policy.param_dtype is not None else shapes.dtype
    torch_stages = [
        PipelineStage(stage, stage.index, n_stages, torch.device(device), group=group,
                      **shapes.stage_args(stage, rows, seq_len // layout.cp, dtype, tp_mesh if tp_mesh.size() > 1 else None))
        for stage in stages
    ]
    params = [p for stage in stages for p in stage.parameters()]
    optimizer = make_optimizer(params)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup)
    return PipelineTrainer(stages, _schedule(torch_stages, pipeline), optimizer, scheduler, shapes.vocab, batch_size, seq_len,
                           seed, dp_rank=dp_rank, dp_size=dp_size,
                           tensor_parallel=tp_mesh.size() > 1, activation="; ".join(applied),
                           context_mesh=mesh["cp"] if layout.cp > 1 else None)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def communication_buffers(trainer: PipelineTrainer) -> list[torch.Tensor]:
    """The receive buffers torch's ``PipelineStage`` keeps between steps: one activation buffer per microbatch on a
    stage that is not first, one gradient buffer per microbatch on a stage that is not last (allocated at the first
    step, reused after)."""
    buffers = []
    for stage in _torch_stages(trainer.schedule):
        for infos in (*stage.args_recv_info.values(), *stage.grad_recv_info.values()):
            buffers.extend(_local(info.buffer) for info in infos if getattr(info, "buffer", None) is not None)
    return buffers


def _torch_stages(schedule) -> list[PipelineStage]:
    return list(getattr(schedule, "_stages", None) or [schedule._stage])


def memory_step(trainer: PipelineTrainer, device_type: str = "cpu",
                probe_class: type[ShardedLiveTensorProbe] = ShardedLiveTensorProbe) -> dict[str, int]:
    """One pipeline step in the two windows of ``distributed.rank`` (the schedule's forward + backward over every
    microbatch, then the optimizer), counted by the rank probe (``probe_class``: the simulated rank passes the
    resize-tracking one of ``simulate.rank_probe``, the same bytes, faster); the stage's receive buffers count from
    the start; ``largest_allgather_bytes`` bounds what gloo's staging of FSDP's all-gathers adds on a CPU rank
    (``distributed.memory``). The same function measures a gloo rank and the simulated (fake) rank."""
    for stage in trainer.stages:
        stage.train()
    resident = [_local(t) for t in trainer.state_tensors()] + communication_buffers(trainer)
    with probe_class(device_type).track(resident=resident) as fwd_bwd:
        trainer.forward_backward()
    grads = [_local(p.grad) for p in trainer.parameters() if p.grad is not None]
    resident = [_local(t) for t in trainer.state_tensors()] + communication_buffers(trainer) + grads
    with probe_class(device_type).track(resident=resident) as opt:
        trainer.optimizer_step()
    trainer.step += 1
    return {
        "peak_bytes": max(fwd_bwd.peak_bytes, opt.peak_bytes),
        "fwd_bwd_start_bytes": fwd_bwd.start_bytes,
        "fwd_bwd_peak_bytes": fwd_bwd.peak_bytes,
        "optimizer_start_bytes": opt.start_bytes,
        "optimizer_peak_bytes": opt.peak_bytes,
        "buffer_bytes": sum(b.untyped_storage().nbytes() for b in communication_buffers(trainer)),
        # the largest FSDP all-gather output of the forward+backward (0 at dp_shard 1): bounds gloo's staging
        "largest_allgather_bytes": int(fwd_bwd.extra.get("largest_allgather_bytes", 0)),
        "stages": [stage.index for stage in trainer.stages],
    }
