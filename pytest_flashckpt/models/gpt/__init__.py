"""The GPT family (GPT-2 / GPT-3 shapes): pre-LN blocks, learned positions, fused qkv, GeLU MLP, tied head.

``from pytest_flashckpt.models.gpt import GPT`` keeps working (the module became this folder); the family's
entry in ``models.families`` builds it from a card and points at its analytic activation bytes and FLOPs.
"""

from pytest_flashckpt.models.gpt.model import GPT, GPT_ANATOMY, GPTConfig

__all__ = ["GPT", "GPTConfig", "GPT_ANATOMY"]
