"""The Llama family's registration (found by ``models.families.families``)."""

from pytest_flashckpt.config.cards.llama import LlamaConfig
from pytest_flashckpt.models.families import Family, register_family
from pytest_flashckpt.models.llama.flops import llama_flop_shape
from pytest_flashckpt.models.llama.model import Llama, llama_anatomy

FAMILY = register_family(Family(
    name="llama", card=LlamaConfig, build=lambda card, backend: Llama(card, backend=backend),
    anatomy=llama_anatomy, flop_shape=llama_flop_shape,
))
