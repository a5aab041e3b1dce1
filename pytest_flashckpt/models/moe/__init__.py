"""The Mixture-of-Experts family (Mixtral / Qwen-MoE shapes): the Llama block with a routed MoE layer, a routing
hook shared by the measured and the simulated step, and closed-form FLOPs from the active parameters."""

from pytest_flashckpt.models.moe.model import MoE, MoEConfig, moe_anatomy

__all__ = ["MoE", "MoEConfig", "moe_anatomy"]
