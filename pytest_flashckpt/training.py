"""Deterministic synthetic training: token batches from (seed, step) and one optimizer step.

Batches depend only on the seed and the data position, so a resumed run sees exactly the tokens an
uninterrupted run would have seen (the checkpoint strategies save the data position, not the data).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn as nn


def make_batch(
    vocab_size: int, batch_size: int, seq_len: int, seed: int, position: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets, each (batch_size, seq_len) int64, for data position ``position``."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + position)
    tokens = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=gen)
    tokens = tokens.to(device)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


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

    @classmethod
    def create(
        cls, model: nn.Module, batch_size: int, seq_len: int, seed: int = 0, lr: float = 3e-4, foreach: bool | None = None,
        autocast: torch.dtype | None = None,
    ) -> "Trainer":
        """AdamW (betas 0.9/0.95, weight decay 0.1) with linear warm-up over 10 steps, as GPT training recipes use.
        ``foreach`` None lets PyTorch choose (multi-tensor on CUDA, per-tensor on a CPU); the simulator sets it to
        run on ``meta`` the implementation a GPU would run. ``autocast`` (mixed precision, e.g. ``torch.bfloat16``)
        needs float32 parameters: autocast computes in its dtype, the parameters stay the master weights."""
        if autocast is not None and any(p.dtype != torch.float32 for p in model.parameters()):
            raise ValueError(f"mixed precision (autocast to {autocast}) keeps float32 master weights; build the model in float32")
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, foreach=foreach)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup)
        return cls(model, optimizer, scheduler, batch_size, seq_len, seed, autocast=autocast)

    def batch(self, position: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        device = next(self.model.parameters()).device
        vocab = self.model.config.vocab_size
        return make_batch(vocab, self.batch_size, self.seq_len, self.seed, self.step if position is None else position, device)

    def train_step(self) -> torch.Tensor:
        """Forward, backward, optimizer and scheduler step on the next batch; returns the (detached) loss."""
        self.model.train()
        x, y = self.batch()
        with self.autocast_context():
            loss = self.loss(x, y)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return loss.detach()

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The step's loss: the project's models take ``model(tokens, targets)`` and return it. A trainer of another
        model overrides this (``activation.step.StepTrainer``: the user's loss or step)."""
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


def _warmup(step: int) -> float:
    return min(1.0, (step + 1) / 10)
