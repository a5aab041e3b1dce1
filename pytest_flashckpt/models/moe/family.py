"""How the family registry (``models.families``) builds a MoE card and counts its step's matmul FLOPs: the two
callables its entry names, kept here so the registry holds one line for the family."""

from __future__ import annotations

import torch.nn as nn

from pytest_flashckpt.config.moe_card import MoEConfig
from pytest_flashckpt.models.moe.flops import expected_matmul_flops
from pytest_flashckpt.models.moe.model import MoE


def build_moe(card: MoEConfig, backend: str) -> nn.Module:
    """The card's ``MoE`` with the concrete attention ``backend`` (on the current default device)."""
    return MoE(card, backend=backend)


def moe_matmul_flops(card: MoEConfig, batch_size: int, seq_len: int, strategy: str = "none", k: int = 2) -> int:
    """The closed-form matmul FLOPs of one training step (``models.moe.flops``), the fused attention kernel's."""
    return expected_matmul_flops(card, batch_size, seq_len, strategy, k)
