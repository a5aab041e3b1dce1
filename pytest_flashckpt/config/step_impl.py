"""How the training step is implemented, as users configure it: the norm, the optimizer and the loss.

The same model card trains with different kernels and optimizers, and they keep different bytes: Hugging Face's
``LlamaRMSNorm`` (plain ops in float32) keeps a float32 copy of its input where torchtitan's ``nn.RMSNorm`` (one
fused kernel on CUDA) keeps the input and a float32 rstd; foreach AdamW makes a full-size ``_foreach_sqrt``
temporary at the optimizer step where ``fused=True`` makes none; a plain loss holds the logits over the whole
vocabulary where a chunked one holds one chunk's. A scenario names its choice (``step_impl:`` in a suite file);
the defaults are what ran before these settings existed, so a scenario without them measures the same step:

- ``norm``: ``None`` (the model card's ``norm``, itself ``plain`` by default), ``plain`` or ``fused``; Llama only.
- ``optimizer``: ``adamw`` (PyTorch's pick: foreach on CUDA, per-tensor on a CPU), ``adamw_foreach``,
  ``adamw_fused`` or ``sgd`` (momentum 0.9: one state tensor per parameter instead of AdamW's two).
- ``loss``: ``plain`` (the model's own head and cross-entropy over every token's logits) or ``chunked``
  (the head and cross-entropy over ``loss_chunks`` sequence chunks, each checkpointed: its logits are freed in
  the forward and made again, one chunk at a time, in the backward).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

NORMS = {
    "plain": "plain ops with float32 statistics, as Hugging Face's LlamaRMSNorm (keeps a float32 copy of its input)",
    "fused": "torch.nn.RMSNorm / F.rms_norm, as torchtitan (on CUDA one _fused_rms_norm kernel: keeps its input and a float32 rstd)",
}
OPTIMIZERS = {
    "adamw": "AdamW as PyTorch picks it: foreach (multi-tensor) on CUDA, per-tensor on a CPU (the default)",
    "adamw_foreach": "AdamW, foreach=True (a full-size _foreach_sqrt temporary at the step)",
    "adamw_fused": "AdamW, fused=True (one fused kernel, no full-size temporaries)",
    "sgd": "SGD with momentum 0.9 (one momentum buffer per parameter)",
}
LOSSES = {
    "plain": "the model's head and cross-entropy over all tokens' logits at once (the default)",
    "chunked": "the head and cross-entropy over sequence chunks, each checkpointed (one chunk's logits at a time)",
}
# optimizer state bytes per parameter byte (in the parameters' dtype; AdamW's step counters are one scalar each)
STATE_TENSORS_PER_PARAMETER = {"adamw": 2, "adamw_foreach": 2, "adamw_fused": 2, "sgd": 1}

Norm = Literal[tuple(NORMS)]  # type: ignore[valid-type]
Optimizer = Literal[tuple(OPTIMIZERS)]  # type: ignore[valid-type]
Loss = Literal[tuple(LOSSES)]  # type: ignore[valid-type]


def _choose(key: str, value: object, choices: dict[str, str]) -> None:
    if value not in choices:
        raise ValueError(f"step_impl.{key}: unknown {key} {value!r}; valid: {', '.join(choices)}")


@dataclass(frozen=True)
class StepImpl:
    """The step's implementation choices (module docstring); ``StepImpl()`` is the step that ran before them."""

    norm: Norm | None = None  # None: the model card's norm (plain unless the card says fused)
    optimizer: Optimizer = "adamw"
    loss: Loss = "plain"
    loss_chunks: int = 8  # chunked: sequence chunks the head and loss run over (torchtune's default count)

    def __post_init__(self) -> None:
        if self.norm is not None:
            _choose("norm", self.norm, NORMS)
        _choose("optimizer", self.optimizer, OPTIMIZERS)
        _choose("loss", self.loss, LOSSES)
        if isinstance(self.loss_chunks, bool) or not isinstance(self.loss_chunks, int) or self.loss_chunks <= 0:
            raise ValueError(f"step_impl.loss_chunks must be a positive number of chunks, got {self.loss_chunks!r}")

    def with_card_norm(self) -> "StepImpl":
        """The same choices with the norm left to the card (what is not the card's to say)."""
        return replace(self, norm=None)

    def describe(self) -> str:
        """One line for notes and reports: ``norm card, optimizer adamw, loss plain``."""
        loss = f"chunked x{self.loss_chunks}" if self.loss == "chunked" else self.loss
        return f"norm {self.norm or 'card'}, optimizer {self.optimizer}, loss {loss}"


def card_with_norm(card, norm: str | None):
    """``card`` with its RMSNorm set to ``norm`` (None: the card as it is). A ValueError naming the card for a
    family without one (GPT's LayerNorm has no implementation to choose)."""
    if norm is None:
        return card
    _choose("norm", norm, NORMS)
    if not hasattr(card, "norm"):
        raise ValueError(f"step_impl.norm {norm!r}: model card {card.name!r} (family {card.family}) has no RMSNorm to "
                         "choose; norm is a llama-family setting: drop step_impl.norm for this card")
    return replace(card, norm=norm)


def check_simulated(impl: StepImpl, strategy: str, world_size: int, norm: str = "plain", precision: str = "pure",
                    target: str = "cuda") -> None:
    """ValueErrors for choices the simulator does not model together (before anything runs); ``norm``: the card's
    RMSNorm after ``impl.norm``."""
    if norm == "fused" and precision == "mixed" and target == "cuda":
        raise ValueError("a fused RMSNorm under mixed precision on CUDA is not simulated (autocast's policy for the fused "
                         "kernel is not modelled): use precision pure, or norm plain")
    if strategy == "budget" and impl.with_card_norm() != StepImpl():
        raise ValueError(f"step_impl ({impl.describe()}) with the budget strategy is not planned: the planner's costs "
                         "are those of the default optimizer and loss; use a fixed strategy or the default step_impl")
    if world_size > 1 and impl.optimizer == "adamw_fused":
        raise ValueError("step_impl.optimizer adamw_fused is simulated in one process; FSDP ranks' fused AdamW over "
                         "DTensor shards is not simulated: use world size 1, or adamw")
