"""The Mixture-of-Experts card (``family: moe``): a Llama-style decoder whose MLP is a routed MoE layer (Mixtral,
Qwen-MoE), read and validated without torch.

Beside the Llama keys a card states the experts (``n_experts`` routed experts of width
``expert_intermediate_size``, ``top_k`` of them per token), an optional shared expert that every token passes
through (``shared_expert_intermediate_size``, 0 for none; Qwen-MoE's ``shared_expert_gate`` scales its output by a
per-token sigmoid) and the **routing assumption** the step is measured and simulated under (``routing``): a
learned router picks experts from the data, which the ``meta`` device cannot run (``torch.where`` on a mask has
no size without values), so the token counts per expert are decided by the card instead:

- ``balanced``: every expert gets ``tokens * top_k / n_experts`` tokens (the remainder, if any, one more each to
  the first experts): the load a load-balancing loss aims at;
- ``capacity``: worst case under a capacity factor: experts in order are filled to
  ``ceil(capacity_factor * tokens * top_k / n_experts)`` tokens (at most every token) until the ``tokens * top_k``
  assignments run out, so the largest expert's tensors are ``capacity_factor`` times the balanced ones and the
  last experts get few or none; no token is dropped;
- ``learned``: the router's own top-k (data-dependent): for measuring a real step; the simulator refuses it.

``num_params()`` counts every parameter, ``active_params()`` those one token uses (its ``top_k`` routed experts,
the shared expert, attention, router, norms, embedding and head), the numbers the model cards publish.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pytest_flashckpt.config.card_names import DecoderCardNames

ROUTINGS: tuple[str, ...] = ("balanced", "capacity", "learned")


@dataclass(frozen=True)
class MoEConfig(DecoderCardNames):
    """Shape of a Mixture-of-Experts decoder (``family: moe``): the Llama block (RMSNorm, rotary positions,
    grouped-query attention, optional q/k/v biases as Qwen's) with the MLP replaced by a router, ``n_experts``
    SwiGLU experts of which ``top_k`` run per token, and an optional shared SwiGLU expert."""

    name: str = "custom"
    description: str = ""
    family: str = "moe"
    vocab_size: int = 2048
    block_size: int = 2048  # longest sequence (rotary positions: no parameters depend on it)
    n_layer: int = 4
    n_head: int = 4  # query heads; head size is n_embd / n_head
    n_kv_head: int = 2  # key/value heads (GQA)
    n_embd: int = 256
    n_experts: int = 8  # routed experts per MoE layer
    top_k: int = 2  # routed experts per token (Mixtral: 2 of 8; Qwen1.5-MoE: 4 of 60)
    expert_intermediate_size: int = 512  # each routed expert's SwiGLU width
    shared_expert_intermediate_size: int = 0  # the shared expert's SwiGLU width; 0: no shared expert (Mixtral)
    shared_expert_gate: bool = False  # a sigmoid(Linear(n_embd, 1)) gate on the shared expert's output (Qwen-MoE)
    norm_topk_prob: bool = True  # renormalise the top-k routing weights to sum to 1 (Mixtral yes, Qwen1.5-MoE no)
    qkv_bias: bool = False  # biases on the q, k and v projections (Qwen's attention)
    routing: Literal["balanced", "capacity", "learned"] = "balanced"  # the token counts per expert (module docstring)
    capacity_factor: float = 1.25  # routing: capacity's fill of the hottest experts, x the balanced load
    rope_theta: float = 1000000.0  # rotary base (Mixtral, Qwen-MoE)
    norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    dropout: float = 0.0  # MoE models here train without dropout; kept so a scenario's override is checked
    allocate_on_cpu: bool = True  # false for cards too big to allocate on a CPU (built on the meta device)

    def __post_init__(self) -> None:
        if self.family != "moe":
            raise ValueError(f"family must be 'moe' for a MoEConfig, got {self.family!r}")
        for key in ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd", "n_experts", "top_k",
                    "expert_intermediate_size"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) must be at most n_experts ({self.n_experts})")
        if self.shared_expert_intermediate_size < 0:
            raise ValueError(f"shared_expert_intermediate_size must be >= 0 (0: no shared expert), "
                             f"got {self.shared_expert_intermediate_size}")
        if self.shared_expert_gate and not self.shared_expert_intermediate_size:
            raise ValueError("shared_expert_gate needs a shared expert: set shared_expert_intermediate_size > 0")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.head_dim % 2:
            raise ValueError(f"head size n_embd / n_head = {self.head_dim} must be even for rotary positions")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})")
        if self.routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {self.routing!r}")
        if not 1.0 <= self.capacity_factor <= self.n_experts / self.top_k:
            raise ValueError(
                f"capacity_factor must be in [1, n_experts / top_k = {self.n_experts / self.top_k:g}] (1: balanced; "
                f"{self.n_experts / self.top_k:g}: every token to the same experts), got {self.capacity_factor}"
            )
        if self.dropout != 0.0:
            raise ValueError(f"dropout must be 0 for the moe family (its blocks have no dropout), got {self.dropout}")
        if self.rope_theta <= 0 or self.norm_eps <= 0:
            raise ValueError("rope_theta and norm_eps must be positive")

    def meta_refusal(self) -> str | None:
        """Why this card's step cannot be simulated on ``meta`` (the card protocol's optional hook), or None."""
        if self.routing == "learned":
            return (f"model card {self.name!r}: routing: learned dispatches tokens by their values, which the meta device "
                    "cannot run; simulate with routing: balanced or capacity (the measured step then uses the same hook)")
        return None

    # the card protocol's other neutral names: config.card_names.DecoderCardNames
    @property
    def mlp_width(self) -> int:
        """The routed experts' hidden width (each expert's gate and up projections)."""
        return self.expert_intermediate_size

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection: n_kv_head * head_dim."""
        return self.n_kv_head * self.head_dim

    def _params(self, routed_experts: int) -> int:
        d, kv = self.n_embd, self.kv_dim
        attention = 2 * d * d + 2 * d * kv + (d + 2 * kv) * int(self.qkv_bias)  # q, o; k, v; q/k/v biases
        experts = routed_experts * 3 * d * self.expert_intermediate_size  # gate, up, down per expert
        shared = 3 * d * self.shared_expert_intermediate_size + d * int(self.shared_expert_gate)
        per_block = attention + d * self.n_experts + experts + shared + 2 * d  # router; two RMSNorm weights
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.vocab_size * d + self.n_layer * per_block + d + head

    def num_params(self) -> int:
        """Every parameter (a tied head counted once), computed without building the model."""
        return self._params(self.n_experts)

    def active_params(self) -> int:
        """The parameters one token's forward uses: ``top_k`` routed experts instead of all of them."""
        return self._params(self.top_k)

    def expert_loads(self, tokens: int) -> list[int]:
        """Tokens per routed expert in one MoE layer of a step of ``tokens`` tokens under ``routing``
        (``balanced`` or ``capacity``; ``learned`` depends on the data, so it has no loads): they sum to
        ``tokens * top_k``, and none exceeds ``tokens`` (an expert sees a token at most once)."""
        if self.routing == "learned":
            raise ValueError(f"model card {self.name!r}: routing: learned has no loads known before the data is "
                             "(use routing: balanced or capacity)")
        assignments, experts = tokens * self.top_k, self.n_experts
        if self.routing == "balanced":
            base, extra = divmod(assignments, experts)
            return [base + (e < extra) for e in range(experts)]
        capacity = min(tokens, math.ceil(self.capacity_factor * assignments / experts))
        loads = []
        for _ in range(experts):
            loads.append(min(capacity, assignments))
            assignments -= loads[-1]
        return loads


CARD = MoEConfig
