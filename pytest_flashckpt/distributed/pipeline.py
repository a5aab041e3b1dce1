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
parameters. Tensor parallel inside a stage is not composed yet (refused).

Limits, each an error naming it: a head tied to the embedding cannot be split over two stages (the two would
live on different ranks); a model with more than one embedding (GPT's learned positions) is refused, as under
tensor parallel; stages are not more than blocks (``config.layout``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.config.layout import Layout, PipelineSchedule
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.models.anatomy import ModelAnatomy, get_anatomy, get_blocks
from pytest_flashckpt.training import _warmup, make_batch, make_optimizer

MESH_DIMS = ("pp", "dp_shard")
SCHEDULE_CLASSES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B}


def make_mesh(layout: Layout, device_type: str = "cpu") -> DeviceMesh:
    """The (pp, dp_shard) mesh of the current process group: pipeline outermost, as torchtitan."""
    if layout.tp > 1 or layout.cp > 1:
        raise ValueError(
            f"layout {layout.describe()}: pipeline stages are composed with FSDP (dp_shard) only so far; use tp 1 "
            "and cp 1 with pp"
        )
    return init_device_mesh(device_type, (layout.pp, layout.dp_shard), mesh_dim_names=MESH_DIMS)


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
    stage's gradients and checkpoints read against one process."""

    def __init__(self, part: nn.Module, index: int, n_stages: int, names: dict[str, str]) -> None:
        super().__init__()
        self.part = part
        self.index, self.n_stages, self.names = index, n_stages, names
        self._received = part.get_submodule(get_anatomy(part).embeddings[0]) if index > 0 else None

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.n_stages - 1

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """First stage: token ids (B, T) in; other stages: the previous stage's hidden states (B, T, C) in.
        Out: hidden states, or the logits on the last stage."""
        if self._received is None:
            return self.part(inputs)
        self._received.hidden = inputs
        # the family's forward reads batch, sequence and device off its token ids: an 8-byte zero, expanded
        tokens = torch.zeros((), dtype=torch.long, device=inputs.device).expand(inputs.shape[:2])
        return self.part(tokens)


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
    """Stage ``index`` of ``n_stages``: a copy of ``model`` holding only that stage's blocks, the embedding on the
    first stage and the final norm and head on the last (``model`` itself is left whole)."""
    anatomy = get_anatomy(model)
    _check_splittable(anatomy, n_stages)
    blocks = get_blocks(model, anatomy)
    kept = stage_ranges(len(blocks), n_stages)[index]
    part = copy.copy(model)  # shallow: its own module dict, the modules shared with ``model`` until deep-copied
    part._modules = dict(model._modules)
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
    part = copy.deepcopy(part)  # the stage owns its parameters: the whole model can go
    prefix = anatomy.blocks + "."
    names = {}
    for name, _ in part.named_parameters():
        full = name
        if name.startswith(prefix):
            local, _, rest = name[len(prefix):].partition(".")
            full = f"{prefix}{block_names[local]}.{rest}"
        names[f"part.{name}"] = full
    return StageModule(part, index, n_stages, names)


def _set_shallow(model: nn.Module, path: str, module: nn.Module) -> None:
    """Replace ``path`` in ``model`` without touching the module it was shared with: every parent on the path is
    shallow-copied first (a dotted path such as ``model.layers`` in a Hugging Face model)."""
    parts = path.split(".")
    parent = model
    for name in parts[:-1]:
        child = copy.copy(parent._modules[name])
        child._modules = dict(child._modules)
        parent._modules[name] = child
        parent = child
    parent._modules[parts[-1]] = module


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
        return x[self.dp_rank :: self.dp_size].contiguous(), y[self.dp_rank :: self.dp_size].contiguous()

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
        self.schedule.step(*args, target=target, losses=self.losses if self.has_last else None)
        if not self.losses:
            return None
        loss = torch.stack([loss.detach() for loss in self.losses]).mean()
        self.losses = []
        return loss

    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def train_step(self) -> torch.Tensor | None:
        loss = self.forward_backward()
        self.optimizer_step()
        self.step += 1
        return loss


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
) -> PipelineTrainer:
    """This rank's stages of ``model`` (built whole, the same weights at every layout), laid out and scheduled.
    ``model`` is consumed: its stages own copies of their parameters."""
    pipeline.check(layout, batch_size=batch_size, n_blocks=len(get_blocks(model)))
    layout.check_batch(batch_size)
    n_stages = layout.pp * pipeline.stages_per_rank
    pp_rank = mesh["pp"].get_local_rank()
    dp_mesh = mesh["dp_shard"]
    stages = [split_stage(model, index, n_stages) for index in stages_of_rank(pp_rank, layout.pp, pipeline.stages_per_rank)]
    del model
    for stage in stages:
        apply_ac(stage.part, activation or ActivationConfig())
        if dp_mesh.size() > 1 or mp_policy is not None:
            kwargs = {"mesh": dp_mesh, "reshard_after_forward": layout.pp == 1}
            kwargs |= {} if mp_policy is None else {"mp_policy": mp_policy}
            for block in get_blocks(stage.part):
                fully_shard(block, **kwargs)
            fully_shard(stage, **kwargs)
    group = mesh["pp"].get_group()
    torch_stages = [PipelineStage(stage, stage.index, n_stages, torch.device(device), group=group) for stage in stages]
    params = [p for stage in stages for p in stage.parameters()]
    optimizer = make_optimizer(params)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup)
    vocab = getattr(getattr(stages[0].part, "config", None), "vocab_size", None)
    return PipelineTrainer(stages, _schedule(torch_stages, pipeline), optimizer, scheduler, vocab, batch_size, seq_len,
                           seed, dp_rank=dp_mesh.get_local_rank(), dp_size=dp_mesh.size())
