"""The GPT family's registration (found by ``models.families.families``)."""

from pytest_flashckpt.config.cards.gpt import GPTConfig
from pytest_flashckpt.models.families import Family, register_family
from pytest_flashckpt.models.gpt.flops import gpt_flop_shape
from pytest_flashckpt.models.gpt.model import GPT, GPT_ANATOMY

FAMILY = register_family(Family(
    name="gpt", card=GPTConfig, build=lambda card, backend: GPT(card, backend=backend),
    anatomy=lambda card: GPT_ANATOMY, flop_shape=gpt_flop_shape, analytic_bytes=True,
))
