"""Model cards (``models/<name>.yaml``) -> a card of its family -> the family's module on a device,
deterministically initialised."""

from __future__ import annotations

import torch

import torch.nn as nn

from pytest_flashckpt.config.model_card import ModelCard, load_card
from pytest_flashckpt.models.families import family_of

__all__ = ["build_model", "load_card"]


def build_model(
    config: ModelCard, backend: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0
) -> nn.Module:
    """The card's model (a GPT, a Llama, ...: ``config.family``) with the concrete ``backend``, initialised from
    ``seed`` on ``device`` (``meta`` allocates nothing)."""
    device = torch.device(device)
    if device.type != "meta" and not config.allocate_on_cpu and device.type == "cpu":
        raise ValueError(
            f"model card {config.name!r} is too large to allocate on a CPU ({config.num_params() / 1e9:.2f}B parameters); "
            "build it on the 'meta' device or run on a GPU"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device(device):
            model = family_of(config).build(config, backend)
    return model.to(dtype=dtype)
