"""Deterministic synthetic training: token batches from (seed, step) and one optimizer step.

Batches depend only on the seed and the data position, so a resumed run sees exactly the tokens an
uninterrupted run would have seen (the checkpoint strategies save the data position, not the data).

The step's optimizer and loss are the scenario's ``config.step_impl.StepImpl`` (the norm is the model card's):
``make_optimizer`` builds the optimizer it names, ``chunked_loss`` the chunked head + cross-entropy.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from pytest_flashckpt.config.step_impl import StepImpl
from pytest_flashckpt.models.anatomy import get_anatomy


def make_batch(
    vocab_size: int, batch_size: int, seq_len: int, seed: int, position: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets, each (batch_size, seq_len) int64, for data position ``position``."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + position)
    tokens = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=gen)
    tokens = tokens.to(device)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def rank_rows(batch: tuple[torch.Tensor, ...], rank: int, world: int) -> tuple[torch.Tensor, ...]:
    """Data-parallel rank ``rank``'s rows (``rank::world``) of each tensor of ``batch``, in storage of their own, as
    a real loader hands a rank its rows only. A view would keep the whole global batch alive, counted by the rank's
    probe: ``contiguous()`` of a one-row slice is such a view (a tensor of one row is contiguous at any stride)."""
    return tuple(t[rank::world].clone(memory_format=torch.contiguous_format) for t in batch)


@dataclass
class Trainer:
    """Model, optimizer and schedule for a run: what a save strategy checkpoints and a resume restores."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    batch_size: int
    seq_len: int
    seed: int = 0
    step: int = 0  # optimizer steps taken; also the data position of the next batch
    # mixed precision in one process: the forward (and loss) runs under torch.autocast(autocast) over the model's
    # float32 parameters (the master weights), so gradients and AdamW state stay float32; None: pure precision
    autocast: torch.dtype | None = None
    impl: StepImpl = field(default_factory=StepImpl)  # the optimizer it was built with and the loss it computes

    @classmethod
    def create(
        cls, model: nn.Module, batch_size: int, seq_len: int, seed: int = 0, lr: float = 3e-4, foreach: bool | None = None,
        autocast: torch.dtype | None = None, impl: StepImpl | None = None,
    ) -> "Trainer":
        """``impl.optimizer`` (``make_optimizer``; AdamW by default) with linear warm-up over 10 steps, as GPT
        training recipes use. ``foreach`` None lets PyTorch choose (multi-tensor on CUDA, per-tensor on a CPU); the
        simulator sets it to run on ``meta`` the implementation a GPU would run. ``autocast`` (mixed precision, e.g.
        ``torch.bfloat16``) needs float32 parameters: autocast computes in its dtype, the parameters stay the master
        weights."""
        impl = impl or StepImpl()
        if autocast is not None and any(p.dtype != torch.float32 for p in model.parameters()):
            raise ValueError(f"mixed precision (autocast to {autocast}) keeps float32 master weights; build the model in float32")
        optimizer = make_optimizer(model.parameters(), impl.optimizer, lr, foreach)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup)
        return cls(model, optimizer, scheduler, batch_size, seq_len, seed, autocast=autocast, impl=impl)

    def batch(self, position: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        device = next(self.model.parameters()).device
        vocab = self.model.config.vocab_size
        return make_batch(vocab, self.batch_size, self.seq_len, self.seed, self.step if position is None else position, device)

    def train_step(self, around: AbstractContextManager | None = None) -> torch.Tensor:
        """Forward, backward, optimizer and scheduler step on the next batch; returns the (detached) loss.
        ``around``: a context held around the forward and backward only (the runner counts the FLOPs of a
        trainer's first warm-up step in it: ``activation.flops.StepCount``)."""
        self.model.train()
        x, y = self.batch()
        with around if around is not None else nullcontext():
            with self.autocast_context():
                loss = self.loss(x, y)
            loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return loss.detach()

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The step's loss: the project's models take ``model(tokens, targets)`` and return it (``impl.loss``
        ``chunked``: ``chunked_loss``). A trainer of another model overrides this (``activation.step.StepTrainer``:
        the user's loss or step)."""
        if self.impl.loss == "chunked":
            return chunked_loss(self.model, x, y, self.impl.loss_chunks)
        return self.model(x, y)

    def autocast_context(self):
        """``torch.autocast`` over the forward for mixed precision (a no-op context in pure precision). On ``meta``
        (the simulator) it is the CPU's autocast, which leaves meta tensors alone: the simulator's model of autocast
        (``simulate.autocast``) reads that state and applies the target device's cast policy."""
        if self.autocast is None:
            return nullcontext()
        device = next(self.model.parameters()).device.type
        return torch.autocast("cpu" if device == "meta" else device, dtype=self.autocast)

    def state_tensors(self) -> list[torch.Tensor]:
        """Every tensor the training state keeps alive between steps (parameters, buffers, optimizer state)."""
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        for state in self.optimizer.state.values():
            tensors.extend(v for v in state.values() if isinstance(v, torch.Tensor))
        return tensors


def make_optimizer(params, name: str = "adamw", lr: float = 3e-4, foreach: bool | None = None) -> torch.optim.Optimizer:
    """The optimizer ``name`` (``config.step_impl.OPTIMIZERS``) over ``params``: AdamW with betas 0.9/0.95 and weight
    decay 0.1 (``adamw``: ``foreach`` as given, None = PyTorch's pick; ``adamw_foreach``; ``adamw_fused``), or SGD
    with momentum 0.9 and the same weight decay (``sgd``; ``foreach`` as given). State per parameter: AdamW two
    tensors of its size and dtype (exp_avg, exp_avg_sq) and a scalar step; SGD one (the momentum buffer)."""
    adamw = {"lr": lr, "betas": (0.9, 0.95), "weight_decay": 0.1}
    if name == "adamw":
        return torch.optim.AdamW(params, foreach=foreach, **adamw)
    if name == "adamw_foreach":
        return torch.optim.AdamW(params, foreach=True, **adamw)
    if name == "adamw_fused":
        return torch.optim.AdamW(params, fused=True, **adamw)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=0.1, foreach=foreach)
    raise ValueError(f"unknown optimizer {name!r}; valid: adamw, adamw_foreach, adamw_fused, sgd")


def chunked_loss(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor, chunks: int) -> torch.Tensor:
    """Mean next-token cross-entropy with the head and the loss over ``chunks`` sequence chunks, each under
    ``torch.utils.checkpoint``: a chunk's logits live only while its loss is computed, in the forward and again in
    the backward, so the step never holds every token's logits (the plain loss holds them, and their gradient,
    at once). The model runs up to its final norm (its head, named by its anatomy, passes the hidden states
    through for that call: ``_head_passes_through``); the head then runs per chunk. The logits have the dtype
    the model's own loss sees (the head's output; autocast's where it is on), so the loss equals the plain one
    up to summation order."""
    head = model.get_submodule(get_anatomy(model).head)
    with _head_passes_through(head):
        hidden = model(tokens)
    total = hidden.new_zeros((), dtype=torch.float32)
    for h, y in zip(hidden.chunk(chunks, dim=1), targets.chunk(chunks, dim=1)):
        total = total + checkpoint(_chunk_loss_sum, head, h, y, use_reentrant=False, preserve_rng_state=False)
    return total / targets.numel()


def _chunk_loss_sum(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = head(hidden)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").float()


@contextmanager
def _head_passes_through(head: nn.Module):
    """``head`` returns its input for the calls inside (an instance ``forward``, removed on exit): the model's own
    forward then ends at its final norm, whatever family it is, without a second code path in every model."""
    head.forward = _identity
    try:
        yield
    finally:
        del head.forward


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _warmup(step: int) -> float:
    return min(1.0, (step + 1) / 10)
