"""Every strategy is a plan: ``plan_for`` gives each block its option, the one role policy decides per op, and bad
options or configurations are errors before anything runs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy

from pytest_flashckpt.activation import StrategyUnavailable, plan_for
from pytest_flashckpt.activation.ops import DEFAULT_SAVE_OPS
from pytest_flashckpt.activation.options import BY_ROLE, DEFAULT_RECOMPUTE_ROLES, FULL, NONE, OFFLOAD, BlockOption
from pytest_flashckpt.activation.policy import RolePolicy
from pytest_flashckpt.config.scenario import ActivationConfig

aten = torch.ops.aten
FORWARD = SimpleNamespace(is_recompute=False)


def test_fixed_strategies_are_plans_of_block_options():
    assert plan_for(ActivationConfig(), 3) == [NONE] * 3
    assert plan_for(ActivationConfig(strategy="full"), 3) == [FULL] * 3
    assert plan_for(ActivationConfig(strategy="every_k", k=2), 5) == [FULL, NONE, FULL, NONE, FULL]
    assert plan_for(ActivationConfig(strategy="offload"), 2, device_type="cuda") == [OFFLOAD] * 2
    (option,) = set(plan_for(ActivationConfig(strategy="selective_op"), 4))
    assert option.kind == "by_op" and option.ops[: len(DEFAULT_SAVE_OPS)] == DEFAULT_SAVE_OPS
    assert option.recompute == DEFAULT_RECOMPUTE_ROLES and option.strict
    (loose,) = set(plan_for(ActivationConfig(strategy="selective_op"), 2, has_anatomy=False))
    assert loose.recompute == () and not loose.strict  # blocks without roles save every listed op
    (listed,) = set(plan_for(ActivationConfig(strategy="selective_op", save_ops=("aten.mm.default",)), 2))
    assert listed.ops == ("aten.mm.default",) and listed.recompute == ()  # an explicit list is taken as it is


def test_bad_plans_are_errors_before_anything_runs():
    with pytest.raises(ValueError, match=r"k=3 is outside the valid range 1\.\.2 "):
        plan_for(ActivationConfig(strategy="every_k", k=3), 2)
    with pytest.raises(StrategyUnavailable, match="on a CPU run there is nothing to offload"):
        plan_for(ActivationConfig(strategy="offload"), 2)
    with pytest.raises(ValueError, match="aten.mm has no overload 'nope'"):
        plan_for(ActivationConfig(strategy="selective_op", save_ops=("aten.mm.nope",)), 2)
    with pytest.raises(ValueError, match="pass the planner and the"):
        plan_for(ActivationConfig(strategy="budget", budget="min"), 2)


@pytest.mark.parametrize(
    "kwargs, message",
    [({"kind": "selective"}, "unknown block option kind 'selective'"),
     ({"kind": "by_role", "saves": ("fc",)}, "unknown role"),
     ({"kind": "by_role", "saves": ("qkv",), "strict": False}, "always strict"),
     ({"kind": "by_op"}, "no ops listed"),
     ({"kind": "full", "saves": ("qkv",)}, "saves= is for by_role")],
)
def test_bad_block_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BlockOption(**kwargs)


def test_option_names_are_the_plans_words():
    assert [o.name for o in (NONE, FULL, OFFLOAD, BY_ROLE[3])] == ["none", "full", "offload", "save(qkv+attn)"]


@pytest.mark.parametrize("option", [BY_ROLE[5], BlockOption("by_op", ops=DEFAULT_SAVE_OPS)])
def test_a_saved_attention_op_that_draws_random_numbers_is_recomputed(option):
    """Under either selective kind: saving it would replay it without advancing the RNG (see policy)."""
    policy = RolePolicy(option)
    flash = aten._scaled_dot_product_flash_attention.default
    assert policy(FORWARD, flash, None, None, None, 0.0) == CheckpointPolicy.MUST_SAVE
    assert policy(FORWARD, flash, None, None, None, 0.1) == CheckpointPolicy.PREFER_RECOMPUTE
    assert policy(FORWARD, aten.gelu.default, None) == CheckpointPolicy.PREFER_RECOMPUTE
