"""The process group, the FSDP2-sharded model (a card's, or a Hugging Face config's) and a data-parallel trainer
for one rank.

Order matters and matches the single-process path: the activation strategy is applied to the plain model first
(``apply_ac`` replaces block ``forward`` methods, parameter names unchanged), then ``fully_shard`` wraps every block
and the root, then the optimizer is built over the sharded (DTensor) parameters.

Mixed precision (``precision="mixed"``) is FSDP2's own: the model is built in float32, so the sharded parameters
(the master weights), their gradients and AdamW's state are float32 shards; ``MixedPrecisionPolicy(param_dtype=
dtype, reduce_dtype=float32)`` all-gathers the parameters cast to the compute dtype and reduce-scatters gradients
in float32. Unlike one-process autocast, every op of a block then computes in the compute dtype (LayerNorm too):
FSDP2 casts the parameters, not the ops. No ``output_dtype``: a block's output stays in the compute dtype.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from pytest_flashckpt.activation import AppliedActivation, apply_ac
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.config.model_card import ModelCard
from pytest_flashckpt.models.anatomy import get_blocks
from pytest_flashckpt.models.cards import build_model
from pytest_flashckpt.models.hf.card import HFCard
from pytest_flashckpt.training import Trainer, make_batch, rank_rows


def init(timeout_s: float = 300.0) -> torch.device:
    """Join the group torchrun describes (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``PORT`` in the environment):
    NCCL on a GPU, gloo on a CPU. ``timeout_s`` bounds every collective, so a rank that hangs ends the others."""
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        backend = "cpu:gloo,cuda:nccl"  # DCP's CPU-side collectives go to gloo
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return device


@dataclass
class ShardedTrainer(Trainer):
    """A ``Trainer`` whose batch is this rank's slice of the global batch (rows ``rank::world``).

    The global batch for a data position is the same at every world size, and each rank's loss is the mean over
    equally many rows, so FSDP's averaged gradient is the global-batch gradient: runs at different world sizes see
    the same data (they differ only in the order of floating-point reductions)."""

    rank: int = 0
    world_size: int = 1

    def batch(self, position: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        device = self.device
        x, y = make_batch(self.model.config.vocab_size, self.batch_size, self.seq_len, self.seed, self.step if position is None else position, device)
        x, y = rank_rows((x, y), self.rank, self.world_size)
        return x, y

    @property
    def device(self) -> torch.device:
        param = next(self.model.parameters())
        return param.device

    def loss_context(self):
        """Nothing around the loss under FSDP alone (a tensor-parallel trainer's is ``loss_parallel``), so one step
        function (``tensor_parallel.forward_backward``) serves both."""
        return contextlib.nullcontext()


def mixed_precision_policy(compute_dtype: torch.dtype) -> MixedPrecisionPolicy:
    """FSDP2 mixed precision: parameters all-gathered in ``compute_dtype``, gradients reduced in float32."""
    return MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)


def shard(model: nn.Module, activation: ActivationConfig | None = None, mp_policy: MixedPrecisionPolicy | None = None,
          before_shard: Callable[[nn.Module], None] | None = None) -> AppliedActivation:
    """Apply the activation strategy to ``model`` (as in one process), then ``before_shard`` (a compiled scenario
    compiles each block there: torchtitan's order), then ``fully_shard`` each block and the root (with
    ``mp_policy`` for mixed precision; None: the parameters' own dtype throughout). The blocks are the model's
    anatomy's (``models.anatomy.get_blocks``): a GPT's ``blocks``, a Llama's, a Hugging Face model's layers."""
    applied = apply_ac(model, activation or ActivationConfig())
    if before_shard is not None:
        before_shard(model)
    kwargs = {} if mp_policy is None else {"mp_policy": mp_policy}
    for block in get_blocks(model):
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return applied


def build_trainer(
    config: ModelCard | HFCard,
    *,
    batch_size: int,
    seq_len: int,
    seed: int = 0,
    backend: str = "sdpa",
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    activation: ActivationConfig | None = None,
    distributed: bool = True,
    precision: str = "pure",
    before_shard: Callable[[nn.Module], None] | None = None,
) -> tuple[ShardedTrainer, AppliedActivation]:
    """The same initial weights at every world size (built whole from ``seed``, then sharded). ``distributed=False``
    builds the plain single-process model (no FSDP) with the full batch: the reference a sharded run is read against
    (in mixed precision it autocasts to ``dtype``, the one-process form). ``precision="mixed"``: float32 master
    state, compute in ``dtype`` (see the module docstring). ``config``: a model card, or a Hugging Face config's
    card (``models.hf.card.hf_card``), built by the builder a one-process run uses."""
    mixed = precision == "mixed"
    param_dtype = torch.float32 if mixed else dtype
    if isinstance(config, HFCard):
        model = config.build(backend, device, param_dtype, seed=seed)
    else:
        model = build_model(config, backend, device, param_dtype, seed=seed)
    if distributed:
        rank, world = dist.get_rank(), dist.get_world_size()
        if batch_size % world:
            raise ValueError(f"batch_size {batch_size} is not divisible by world_size {world}; each rank needs an equal share")
        applied = shard(model, activation, mixed_precision_policy(dtype) if mixed else None, before_shard)
    else:
        rank, world = 0, 1
        applied = apply_ac(model, activation or ActivationConfig())
    autocast = dtype if mixed and not distributed else None
    trainer = ShardedTrainer.create(model, batch_size, seq_len, seed=seed, autocast=autocast)
    trainer.rank, trainer.world_size = rank, world
    return trainer, applied
