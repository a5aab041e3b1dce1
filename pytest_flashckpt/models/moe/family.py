"""The Mixture-of-Experts family's registration (found by ``models.families.families``)."""

from pytest_flashckpt.config.cards.moe import MoEConfig
from pytest_flashckpt.models.families import Family, register_family
from pytest_flashckpt.models.moe.flops import moe_flop_shape
from pytest_flashckpt.models.moe.model import MoE, moe_anatomy

FAMILY = register_family(Family(
    name="moe", card=MoEConfig, build=lambda card, backend: MoE(card, backend=backend),
    anatomy=moe_anatomy, flop_shape=moe_flop_shape,
))
