"""The fingerprint a baseline entry stores and the gate compares (``config.fingerprint``), with the defaults that
only ``activation/`` resolves: what ``selective_op`` saves and recomputes when a scenario lists no ``save_ops``.

A changed default changes the numbers as surely as a changed setting, so it must read "not comparable", never
"regressed" or "improved" (issue 31; the AMD baseline measured before the default of issue 33 read +24% overhead
"regressed" on ``llama-tiny-selective_op``). The resolved default enters the fingerprint only where it differs
from ``RECORDED_SINCE``, the default of the day fingerprints began to carry it: every fingerprint stored before
(at that same default) still matches, and the next change of ``DEFAULT_SAVE_OPS`` or ``DEFAULT_RECOMPUTE_ROLES``
makes each stored ``selective_op`` entry without ``save_ops`` "not comparable", naming the key. Leave
``RECORDED_SINCE`` as it is when you change a default: that is what makes the change visible.
"""

from __future__ import annotations

from typing import Any

from pytest_flashckpt.activation.ops import DEFAULT_SAVE_OPS
from pytest_flashckpt.activation.options import DEFAULT_RECOMPUTE_ROLES
from pytest_flashckpt.config import fingerprint as config_fingerprint
from pytest_flashckpt.config.scenario import Scenario

# selective_op's default on 2026-12-02 (issue 33 item 5: save every matmul and attention output, recompute o and down)
RECORDED_SINCE: dict[str, list[str]] = {
    "activation.default_save_ops": ["aten.mm.default", "aten.addmm.default", "aten.bmm.default",
                                    "aten._scaled_dot_product_flash_attention_for_cpu.default",
                                    "aten._scaled_dot_product_flash_attention.default",
                                    "aten._scaled_dot_product_efficient_attention.default",
                                    "aten._scaled_dot_product_cudnn_attention.default"],
    "activation.default_recompute": ["o", "down"],
}


def resolved_defaults(scenario: Scenario) -> dict[str, Any]:
    """The run-time defaults of ``scenario`` that differ from ``RECORDED_SINCE``, as flat fingerprint keys."""
    if scenario.activation.strategy != "selective_op" or scenario.activation.save_ops is not None:
        return {}
    today = {"activation.default_save_ops": list(DEFAULT_SAVE_OPS),
             "activation.default_recompute": list(DEFAULT_RECOMPUTE_ROLES)}
    return {key: value for key, value in today.items() if value != RECORDED_SINCE[key]}


def fingerprint(scenario: Scenario) -> str:
    return config_fingerprint.fingerprint(scenario, resolved_defaults(scenario))


def fingerprinted(scenario: Scenario) -> dict[str, Any]:
    return config_fingerprint.fingerprinted(scenario, resolved_defaults(scenario))
