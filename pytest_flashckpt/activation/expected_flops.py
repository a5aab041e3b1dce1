"""FLOPs of one training step in closed form, for any family and strategy: what ``activation.flops`` measures.

The family gives its block (``Family.flop_shape``: projection widths by role, ``models.step_flops``), the strategy's
plan (``activation.plan.plan_for``) says what each block replays; no strategy or family is named here, so a new one
is counted as soon as it is registered (or refused with the reason: a family without a flop shape, a strategy whose
plan is chosen per input shape). A module apart from ``activation.flops`` because the budget planner measures FLOPs
below the plan layer, and this closed form reads the plan.
"""

from __future__ import annotations

from pytest_flashckpt.activation.options import BlockOption
from pytest_flashckpt.activation.plan import plan_for
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.core.registry import ACTIVATION_STRATEGIES
from pytest_flashckpt.models.families import family_of
from pytest_flashckpt.models.step_flops import BlockReplay, step_matmul_flops


def expected_matmul_flops(card, batch_size: int, seq_len: int, strategy: str = "none", k: int = 2,
                          fused_attention: bool = True) -> int:
    """FlopCounterMode's count of one step of ``card``'s model, in closed form (``models.step_flops``): its family's
    block (``Family.flop_shape``) and what each block replays under the strategy's plan (``block_replays``).
    ``fused_attention``: a flash / SDPA-efficient kernel (False: eager, or SDPA's math path on a CPU with dropout).

    A ValueError for a family without a closed form and for a strategy whose plan has none (``budget``: its plans
    are chosen per input shape from measured costs)."""
    family = family_of(card)
    if family.flop_shape is None:
        raise ValueError(f"model card {card.name!r}: the {family.name} family has no closed-form FLOPs (measure them: measure_step_flops)")
    spec = ACTIVATION_STRATEGIES.get(strategy)
    if spec is not None and spec.takes_budget:
        raise ValueError(f"strategy {strategy!r} has no closed-form FLOPs: its plans are chosen per input shape from "
                         "measured costs (measure them: measure_step_flops)")
    options = plan_for(ActivationConfig(strategy=strategy, k=k), card.num_blocks, device_type="cuda")
    return step_matmul_flops(batch_size, seq_len, card.width, card.vocab_size, family.flop_shape(card),
                             block_replays(options), fused_attention=fused_attention)


def block_replays(options: list[BlockOption]) -> list[BlockReplay]:
    """What each block of a plan recomputes in the backward pass, as the closed form counts it: ``full`` its forward,
    ``by_op`` the projections it recomputes (``recompute`` roles), ``none`` and ``offload`` nothing; a ValueError
    for an option the closed form has no term for (``by_role``: which matmuls replay depends on the saved groups)."""
    replays = []
    for option in options:
        if option.kind == "full":
            replays.append(BlockReplay(whole=True))
        elif option.kind == "by_op":
            replays.append(BlockReplay(roles=tuple(option.recompute)))
        elif option.kind in ("none", "offload"):
            replays.append(BlockReplay())
        else:
            raise ValueError(f"the FLOP closed form has no term for block option {option.name!r}")
    return replays
