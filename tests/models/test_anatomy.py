"""The anatomy seam: a model states which module is which, and a block that does not match is an error."""

import pytest
import torch
import torch.nn as nn

from pytest_flashckpt.models import build_model, load_card
from pytest_flashckpt.models.anatomy import (
    BlockAnatomy,
    ModelAnatomy,
    check_block,
    current_role,
    get_anatomy,
    get_blocks,
    register_discoverer,
    role_hooks,
)


def _gpt():
    return build_model(load_card("tiny", n_layer=2), "eager")


def test_gpt_anatomy_names_its_modules_and_every_block_matches():
    model = _gpt()
    anatomy = get_anatomy(model)
    assert anatomy.family == "gpt"
    blocks = get_blocks(model)
    assert blocks is model.blocks
    for i, block in enumerate(blocks):
        check_block(anatomy, block, where=f"blocks.{i}")
    assert model.get_parameter(anatomy.tied[0][0]) is model.get_parameter(anatomy.tied[0][1])


def test_a_matmul_without_a_role_is_an_error_naming_the_block_and_module():
    model = _gpt()
    block = model.blocks[1]
    block.mlp.extra = nn.Linear(4, 4)
    with pytest.raises(ValueError, match=r"blocks\.1 .*without a role: mlp\.extra"):
        check_block(get_anatomy(model), block, where="blocks.1")


def test_a_projection_that_is_missing_or_not_a_matmul_is_an_error():
    wrong = BlockAnatomy(projections={"qkv": "attn.c_attn", "o": "ln_1", "up": "mlp.c_fc", "down": "mlp.nope"}, attention="attn")
    with pytest.raises(ValueError, match=r"'o' names 'ln_1', a LayerNorm.*'down' names 'mlp.nope'.*attn\.c_proj"):
        check_block(wrong, _gpt().blocks[0])


def test_bad_roles_are_refused_when_the_anatomy_is_made():
    with pytest.raises(ValueError, match="unknown projection role"):
        BlockAnatomy(projections={"fc": "mlp.c_fc"}, attention="attn")
    with pytest.raises(ValueError, match="either a fused 'qkv'"):
        BlockAnatomy(projections={"qkv": "a", "q": "b"}, attention="attn")
    with pytest.raises(ValueError, match="more than one role"):
        BlockAnatomy(projections={"up": "a", "down": "a"}, attention="attn")


def test_unknown_model_error_says_what_to_do_and_a_discoverer_answers():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Sequential(nn.Linear(2, 2))])

    with pytest.raises(ValueError, match="no anatomy for a Odd.*register_discoverer"):
        get_anatomy(Odd())
    anatomy = ModelAnatomy("custom", "layers", BlockAnatomy({"up": "0"}, attention="0"))

    def discover(model):
        return anatomy if isinstance(model, Odd) else None

    register_discoverer(discover)
    try:
        assert get_anatomy(Odd()) is anatomy
        assert len(get_blocks(Odd())) == 1
    finally:
        from pytest_flashckpt.models import anatomy as module

        module._DISCOVERERS.remove(discover)


def test_role_hooks_set_the_current_role_while_each_projection_runs():
    model = _gpt()
    seen = []
    block = model.blocks[0]
    hooks = role_hooks(block, get_anatomy(model))
    for name in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
        block.get_submodule(name).register_forward_hook(lambda m, a, o: seen.append(current_role()), prepend=True)
    block(torch.randn(1, 3, 256))
    assert seen == ["qkv", "o", "up", "down"]
    assert current_role() is None
    hooks.remove()
    seen.clear()
    block(torch.randn(1, 3, 256))
    assert seen == [None] * 4
