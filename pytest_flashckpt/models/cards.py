"""Model cards (``models/<name>.yaml``) -> ``GPTConfig`` -> a GPT on a device, deterministically initialised."""

from __future__ import annotations

from pathlib import Path

import torch

from pytest_flashckpt.config.data import resolve
from pytest_flashckpt.config.typed import build, load_yaml
from pytest_flashckpt.models.gpt import GPT, GPTConfig


def load_card(name_or_path: str | Path, **overrides) -> GPTConfig:
    """Read a model card by shipped name (``tiny``) or path; ``overrides`` replace card fields (validated)."""
    path = resolve("models", str(name_or_path))
    data = load_yaml(path) or {}
    if isinstance(data, dict):
        data = {**data, **overrides}
    return build(GPTConfig, data, where=str(path))


def build_model(
    config: GPTConfig, backend: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0
) -> GPT:
    """A GPT with the concrete ``backend``, initialised from ``seed`` on ``device`` (``meta`` allocates nothing)."""
    device = torch.device(device)
    if device.type != "meta" and not config.allocate_on_cpu and device.type == "cpu":
        raise ValueError(
            f"model card {config.name!r} is too large to allocate on a CPU ({config.num_params() / 1e9:.2f}B parameters); "
            "build it on the 'meta' device or run on a GPU"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device(device):
            model = GPT(config, backend=backend)
    return model.to(dtype=dtype)
