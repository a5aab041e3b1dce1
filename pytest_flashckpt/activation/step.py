"""The training step the budget planner measures on any model: how the model is called and what its loss is.

The planner measures real steps (``budget.costs``), so it must run the user's step, not guess one. The project's
models (and ``models.hf.build_hf_model``'s) take ``model(tokens, targets)`` and return the loss; any other model
says how, with either

- ``loss=fn(output, targets) -> loss``: the model is called on the tokens (``call_model``: ``model(tokens)``; a
  transformers model ``model(input_ids=tokens, use_cache=False)``, since a KV cache filled by the forward would be
  appended to again by a checkpointed layer's recomputation) and ``fn`` reads its output, whatever its structure
  (a tensor, a ``ModelOutput``, a tuple, a dict; ``logits_of`` finds the logits for ``next_token_loss``); or
- ``step=fn(model, tokens, targets) -> loss``: the whole forward, called with the model the planner measures (a
  private copy: use the argument, not a model the closure holds).

Without either, a transformers model gets ``loss=next_token_loss`` and any other model the project's call. The
batches are the project's synthetic token batches (``training.make_batch``) over the model's vocabulary
(``vocab_size=``, else ``model.config.vocab_size`` or ``model.vocab_size``). What the step returns is checked: a
scalar tensor with a graph, or a ValueError saying which call gave what and how to give the step instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from pytest_flashckpt.models.families import is_transformers_model
from pytest_flashckpt.training import Trainer, make_batch

LossFn = Callable[[Any, torch.Tensor], torch.Tensor]  # (model output, targets) -> scalar loss
StepFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]  # (model, tokens, targets) -> scalar loss

FIX = "pass loss=fn(output, targets) or step=fn(model, tokens, targets) (apply_budget / apply_ac / MeasuredCosts)"


def call_model(model: nn.Module, tokens: torch.Tensor) -> Any:
    """The model's output for ``tokens``: ``model(input_ids=tokens, use_cache=False)`` for a transformers model
    (no KV cache in training; see the module docstring), ``model(tokens)`` for any other."""
    if is_transformers_model(model):
        return model(input_ids=tokens, use_cache=False)
    return model(tokens)


def logits_of(output: Any) -> torch.Tensor:
    """The logits in a model's output: the tensor itself, ``.logits`` (a transformers ``ModelOutput``), a mapping's
    ``"logits"``, or a tuple's / list's first tensor. A ValueError for anything else."""
    if isinstance(output, torch.Tensor):
        return output
    logits = output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, (tuple, list)):
        first = next((t for t in output if isinstance(t, torch.Tensor)), None)
        if first is not None:
            return first
    raise ValueError(f"next_token_loss: no logits in a {type(output).__name__} (a tensor, .logits, ['logits'] or a "
                     f"tuple's first tensor); {FIX}")


def next_token_loss(output: Any, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of the output's logits (batch, seq, vocab) against ``targets`` (batch, seq),
    already shifted by ``training.make_batch``; in float32, as transformers computes its own loss."""
    logits = logits_of(output)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


@dataclass(frozen=True)
class TrainingStep:
    """How to run one model's step: ``call(model, tokens, targets) -> loss``, over ``vocab_size`` tokens.
    ``described`` names the call in errors; ``explain_failure``: the call is a guess (a default on a model that is
    none of the project's), so its failure is explained with the fix; a given step, or the call of a model of
    ours, raises its own errors."""

    call: StepFn
    vocab_size: int
    described: str
    explain_failure: bool = False

    def loss(self, model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The step's loss, checked: a scalar tensor that requires grad (ValueError naming the call and the fix)."""
        try:
            loss = self.call(model, tokens, targets)
        except (TypeError, AttributeError, ValueError, IndexError, RuntimeError) as exc:
            if not self.explain_failure:
                raise
            raise ValueError(
                f"budget: measuring a {type(model).__name__} with the default step {self.described} failed "
                f"({type(exc).__name__}: {exc}); {FIX}"
            ) from exc
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
            got = (f"a tensor of shape {tuple(loss.shape)}{'' if loss.requires_grad else ' without a graph'}"
                   if isinstance(loss, torch.Tensor) else f"a {type(loss).__name__}")
            raise ValueError(f"budget: the step {self.described} on a {type(model).__name__} returned {got}, not a scalar "
                             f"loss to backpropagate; {FIX}")
        return loss


def training_step(model: nn.Module, step: StepFn | None = None, loss: LossFn | None = None,
                  vocab_size: int | None = None) -> TrainingStep:
    """The ``TrainingStep`` of ``model`` from what the user gave (see the module docstring). ValueError, before
    anything runs, for both ``step`` and ``loss``, a non-callable, or a vocabulary size that cannot be found."""
    if step is not None and loss is not None:
        raise ValueError("budget: give the step either as loss= (a function of the model's output) or as step= (the "
                         "whole forward), not both")
    for name, fn in (("step", step), ("loss", loss)):
        if fn is not None and not callable(fn):
            raise ValueError(f"budget: {name}= must be a function, got a {type(fn).__name__}; {FIX}")
    vocab = _vocab_size(model, vocab_size)
    if step is not None:
        return TrainingStep(step, vocab, f"step={_name(step)}(model, tokens, targets)")
    if loss is not None:
        return TrainingStep(lambda m, x, y: loss(call_model(m, x), y), vocab, f"loss={_name(loss)}({_call(model)}, targets)")
    if is_transformers_model(model) and not _ours(model):  # built by the user, not build_hf_model
        return TrainingStep(lambda m, x, y: next_token_loss(call_model(m, x), y), vocab,
                            f"next_token_loss({_call(model)}, targets)", explain_failure=True)
    return TrainingStep(lambda m, x, y: m(x, y), vocab, "model(tokens, targets)", explain_failure=not _ours(model))


def _ours(model: nn.Module) -> bool:
    """Built by the project (a card's family, or ``models.hf.build_hf_model``): it takes ``model(tokens, targets)``."""
    return hasattr(model, "flashckpt_family") or (hasattr(getattr(model, "config", None), "family") and hasattr(model, "backend"))


def _vocab_size(model: nn.Module, given: int | None) -> int:
    if given is not None:
        if not isinstance(given, int) or isinstance(given, bool) or given < 1:
            raise ValueError(f"budget: vocab_size={given!r} must be a positive int (the number of token ids)")
        return given
    for value in (getattr(getattr(model, "config", None), "vocab_size", None), getattr(model, "vocab_size", None)):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    raise ValueError(f"budget: the planner measures steps on synthetic token batches, but a {type(model).__name__} has "
                     "no config.vocab_size or vocab_size; pass vocab_size= (the number of token ids)")


def _call(model: nn.Module) -> str:
    return "model(input_ids=tokens, use_cache=False)" if is_transformers_model(model) else "model(tokens)"


def _name(fn: Callable) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


@dataclass
class StepTrainer(Trainer):
    """A ``Trainer`` whose batches and loss come from a ``TrainingStep``: the planner's measured steps (and a test's
    or user's check of a plan's peak) run exactly the step the user gave."""

    training: TrainingStep | None = None

    @classmethod
    def for_step(cls, model: nn.Module, training: TrainingStep, batch_size: int, seq_len: int, seed: int = 0) -> "StepTrainer":
        trainer = cls.create(model, batch_size, seq_len, seed)
        trainer.training = training
        return trainer

    def batch(self, position: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        device = next(self.model.parameters()).device
        vocab = self.training.vocab_size if self.training is not None else self.model.config.vocab_size
        return make_batch(vocab, self.batch_size, self.seq_len, self.seed, self.step if position is None else position, device)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.training is None:
            return super().loss(x, y)
        return self.training.loss(self.model, x, y)
