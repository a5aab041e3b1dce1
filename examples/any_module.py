"""Activation checkpointing on a model pytest-flashckpt does not ship: give ``apply_ac`` its blocks.

The model below is written here, not in the project: its blocks live in ``layers`` (not ``blocks``), take a
keyword argument (``scale``) besides the hidden states, and use a post-norm MLP with a bias-free gate. Two ways to
hand it to a strategy:

1. ``apply_ac(model, config, blocks="layers")``: any strategy on those blocks; the budget planner measures whole-
   block options (keep or recompute) on a copy of the model. No anatomy is needed, so op-level policies cannot
   tell one matmul from another: ``selective_op`` saves every listed op and the planner offers no selective option.
2. ``model.anatomy()`` returning a ``ModelAnatomy`` (which module is q/k/v/o/up/gate/down): every strategy works
   by role, each block is checked against it, and the planner also offers its selective options.

Run: ``python examples/any_module.py`` (CPU, a few seconds); ``tests/test_examples.py`` runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.models.anatomy import BlockAnatomy, ModelAnatomy
from pytest_flashckpt.probes.cpu import LiveTensorProbe
from pytest_flashckpt.training import Trainer, make_batch


@dataclass(frozen=True)
class TinyLMConfig:
    vocab_size: int = 80
    width: int = 40
    heads: int = 5
    depth: int = 3


class Layer(nn.Module):
    def __init__(self, c: TinyLMConfig) -> None:
        super().__init__()
        self.heads = c.heads
        self.qkv = nn.Linear(c.width, 3 * c.width)
        self.out = nn.Linear(c.width, c.width)
        self.gate = nn.Linear(c.width, 2 * c.width, bias=False)
        self.value = nn.Linear(c.width, 2 * c.width, bias=False)
        self.back = nn.Linear(2 * c.width, c.width)
        self.norm = nn.LayerNorm(c.width)

    def forward(self, h: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        B, T, C = h.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(h).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        h = h + scale * self.out(y)
        return self.norm(h + self.back(F.silu(self.gate(h)) * self.value(h)))


class TinyLM(nn.Module):
    """forward(idx, targets) -> loss, and ``config.vocab_size``: what the budget planner's measuring step uses."""

    def __init__(self, c: TinyLMConfig) -> None:
        super().__init__()
        self.config = c
        self.embed = nn.Embedding(c.vocab_size, c.width)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.depth))
        self.unembed = nn.Linear(c.width, c.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = self.embed(idx)
        for layer in self.layers:
            h = layer(h, scale=0.5)
        logits = self.unembed(h)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class TinyLMWithAnatomy(TinyLM):
    """The same model stating which module is which (``attention=""``: the block itself calls the kernel)."""

    def anatomy(self) -> ModelAnatomy:
        block = BlockAnatomy({"qkv": "qkv", "o": "out", "gate": "gate", "up": "value", "down": "back"}, attention="", norms=("norm",))
        return ModelAnatomy("custom", "layers", block, embeddings=("embed",), head="unembed")


def build(with_anatomy: bool) -> TinyLM:
    torch.manual_seed(0)
    return (TinyLMWithAnatomy if with_anatomy else TinyLM)(TinyLMConfig())


def gradients(model: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    x, y = make_batch(model.config.vocab_size, 2, 48, seed=1, position=0)
    loss = model(x, y)
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


def peak_bytes(model: nn.Module) -> int:
    trainer = Trainer.create(model, 2, 48)
    trainer.train_step()
    with LiveTensorProbe().track(trainer.state_tensors()) as reading:
        trainer.train_step()
    return reading.peak_bytes


def main() -> dict[str, dict]:
    out: dict[str, dict] = {}
    reference_loss, reference = gradients(build(False))
    none_peak = peak_bytes(build(False))
    for with_anatomy in (False, True):
        for activation in (ActivationConfig(strategy="full"), ActivationConfig(strategy="every_k", k=2),
                           ActivationConfig(strategy="selective_op"), ActivationConfig(strategy="budget", budget="min + 25%")):
            model = build(with_anatomy)
            blocks = None if with_anatomy else "layers"
            applied = apply_ac(model, activation, shape=(2, 48), blocks=blocks)
            loss, grads = gradients(model)
            bitwise = torch.equal(loss, reference_loss) and all(torch.equal(grads[n], reference[n]) for n in reference)
            row = {"bitwise": bitwise, "describe": applied.describe()}
            if activation.strategy == "budget":
                model = build(with_anatomy)
                applied = apply_ac(model, activation, shape=(2, 48), blocks=blocks)
                plan = applied.plans[(2, 48)]
                row.update(peak=peak_bytes(model), budget=plan.budget_bytes, options=plan.options)
            key = f"{activation.strategy} ({'anatomy' if with_anatomy else 'blocks='})"
            out[key] = row
            print(f"{key:28} bitwise={bitwise}  {row.get('options', applied.describe())}"
                  + (f"  peak {row['peak']:,} <= budget {row['budget']:,} B (none: {none_peak:,})" if "peak" in row else ""))
    return out


if __name__ == "__main__":
    main()
