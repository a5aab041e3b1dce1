"""The GPT family (GPT-2 / GPT-3 shapes): pre-LN blocks, learned positions, fused qkv, GeLU MLP, tied head.

``from pytest_flashckpt.models.gpt import GPT`` keeps working (the module became this folder); ``family.py``
registers the family (``models.families``): how a card builds it, its anatomy, its FLOP closed form
(``flops.py``) and that ``activation.analytic`` models its kept bytes. Its card schema is ``config/cards/gpt.py``.
"""

from pytest_flashckpt.models.gpt.model import GPT, GPT_ANATOMY, GPTConfig

__all__ = ["GPT", "GPTConfig", "GPT_ANATOMY"]
