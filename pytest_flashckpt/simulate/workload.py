"""What a simulated step runs on: a dtype by name, a workload the card can run, the card's model on ``meta``
with the backend that reproduces a kernel, and the trainer a run on the target has. Shared by the simulated step
(``simulate.step``) and the planner's simulated costs (``simulate.costs``), so the costs need not import the step
(the step imports the costs for strategy ``budget``).
"""

from __future__ import annotations

import torch

from pytest_flashckpt.config.model_card import ModelCard as GPTConfig  # any family's card
from pytest_flashckpt.models.cards import build_model
from pytest_flashckpt.simulate.kernels import simulated_backend
from pytest_flashckpt.training import Trainer

DTYPE_NAMES = {
    "float32": "float32", "fp32": "float32", "f32": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16",
}


def dtype_name(dtype: str | torch.dtype) -> str:
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).removeprefix("torch.")
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPE_NAMES)}")
    return DTYPE_NAMES[dtype]


def check_workload(card: GPTConfig, batch_size: int, seq_len: int, world_size: int = 1) -> None:
    """ValueErrors naming the value for a workload the card cannot run."""
    if batch_size <= 0:
        raise ValueError(f"batch size must be positive, got {batch_size}")
    if seq_len <= 0:
        raise ValueError(f"sequence length must be positive, got {seq_len}")
    if seq_len > card.block_size:
        raise ValueError(
            f"sequence length {seq_len} is longer than the {card.block_size} positions of model card {card.name!r}"
        )
    if world_size <= 0:
        raise ValueError(f"world size must be positive, got {world_size}")
    if batch_size % world_size:
        raise ValueError(
            f"world size {world_size} does not divide the batch size {batch_size}; each rank needs a whole batch "
            f"(use a batch that is a multiple of {world_size})"
        )


def simulated_model(config: GPTConfig, dtype: str, kernel: str, target: str, seed: int = 0, precision: str = "pure"):
    """The card's model on ``meta`` with the backend that reproduces ``kernel`` on ``target`` (``kernels``); its
    parameters in ``dtype``, or float32 master weights in mixed precision (the backend is chosen for ``dtype``, the
    dtype attention computes in)."""
    backend = simulated_backend(kernel, target, dtype, config.dropout)
    return build_model(config, backend, "meta", torch.float32 if precision == "mixed" else getattr(torch, dtype), seed=seed)


def simulated_trainer(model, batch_size: int, seq_len: int, target: str, seed: int = 0,
                      autocast: torch.dtype | None = None) -> Trainer:
    """The trainer a run on ``target`` has: CUDA's default AdamW is the multi-tensor (foreach) one; on a CPU (and
    on meta) PyTorch picks per-tensor, so a ``cuda`` prediction asks for foreach explicitly."""
    return Trainer.create(model, batch_size, seq_len, seed=seed, foreach=True if target == "cuda" else None, autocast=autocast)
