"""What a simulated step runs on: a dtype by name, a workload the card can run, the card's model on ``meta``
with the backend that reproduces a kernel, and the trainer a run on the target has. Shared by the simulated step
(``simulate.step``) and the planner's simulated costs (``simulate.costs``), so the costs need not import the step
(the step imports the costs for strategy ``budget``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from pytest_flashckpt.config.model_card import ModelCard
from pytest_flashckpt.config.step_impl import StepImpl
from pytest_flashckpt.models.cards import build_model
from pytest_flashckpt.models.hf.build import HFConfigProblem, HFUnavailable
from pytest_flashckpt.models.hf.card import HFCard, hf_card
from pytest_flashckpt.simulate.kernels import simulated_backend
from pytest_flashckpt.training import Trainer

DTYPE_NAMES = {
    "float32": "float32", "fp32": "float32", "f32": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16",
}


def dtype_name(dtype: str | torch.dtype) -> str:
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).removeprefix("torch.")
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPE_NAMES)}")
    return DTYPE_NAMES[dtype]


TENSOR_BYTES_LIMIT = 2**63  # torch's storage sizes are int64 bytes: a larger tensor cannot exist, not even on meta


def largest_tensor(card: ModelCard, batch_size: int, seq_len: int) -> tuple[str, int]:
    """The widest tensor one rank's step makes (name, bytes), from the card's shape: the tokens (int64), the
    float32 logits the loss reads, the MLP's hidden activations and eager attention's scores (float32: the widest
    dtype a step computes in). Only to refuse a workload no tensor can hold; the simulation counts the real ones."""
    tokens = batch_size * seq_len
    mlp_width = card.mlp_width
    candidates = {
        "token batch": batch_size * (seq_len + 1) * 8,
        "logits": tokens * card.vocab_size * 4,
        "MLP activation": tokens * mlp_width * 4,
        "attention scores": batch_size * card.num_heads * seq_len * seq_len * 4,
    }
    return max(candidates.items(), key=lambda item: item[1])


def check_workload(card: ModelCard, batch_size: int, seq_len: int, world_size: int = 1) -> None:
    """ValueErrors naming the value for a workload the card cannot run (a card's optional ``meta_refusal``: why its
    step cannot run on meta, e.g. a MoE card's learned routing)."""
    refusal = getattr(card, "meta_refusal", lambda: None)()
    if refusal is not None:
        raise ValueError(refusal)
    if batch_size <= 0:
        raise ValueError(f"batch size must be positive, got {batch_size}")
    if seq_len <= 0:
        raise ValueError(f"sequence length must be positive, got {seq_len}")
    if seq_len > card.max_seq_len:
        raise ValueError(
            f"sequence length {seq_len} is longer than the {card.max_seq_len} positions of "
            + (f"Hugging Face config {card.name!r} (its max_position_embeddings / n_positions)"
               if isinstance(card, HFCard) else f"model card {card.name!r}")
        )
    if world_size <= 0:
        raise ValueError(f"world size must be positive, got {world_size}")
    if batch_size % world_size:
        raise ValueError(
            f"world size {world_size} does not divide the batch size {batch_size}; each rank needs a whole batch "
            f"(use a batch that is a multiple of {world_size})"
        )
    name, nbytes = largest_tensor(card, batch_size // world_size, seq_len)
    if nbytes >= TENSOR_BYTES_LIMIT:
        raise ValueError(
            f"batch {batch_size} x seq {seq_len}: the step's {name} alone would be {nbytes:.3g} bytes, beyond the "
            f"2**63 bytes a tensor can describe even on meta; use a smaller batch or sequence"
        )


def simulated_model(config: ModelCard | HFCard, dtype: str, kernel: str, target: str, seed: int = 0, precision: str = "pure"):
    """The card's model on ``meta`` with the backend that reproduces ``kernel`` on ``target`` (``kernels``); its
    parameters in ``dtype``, or float32 master weights in mixed precision (the backend is chosen for ``dtype``, the
    dtype attention computes in). A Hugging Face config's card (``models.hf.card``) builds its transformers model
    with the same builder a measured run uses, its attention the same explicit kernel op."""
    backend = simulated_backend(kernel, target, dtype, config.dropout)
    param_dtype = torch.float32 if precision == "mixed" else getattr(torch, dtype)
    if isinstance(config, HFCard):
        return config.build(backend, "meta", param_dtype, seed=seed)
    return build_model(config, backend, "meta", param_dtype, seed=seed)


def simulation_card(model: str, hf_config: str | None = None) -> ModelCard | HFCard | str:
    """What ``flashckpt simulate`` simulates: the Hugging Face config ``hf_config`` (a config.json path), or
    ``model``, a card name or path; a ``--model`` that is a JSON file with a ``model_type`` is a Hugging Face
    config too (a transformers config.json is not a model card, so it is not read as one). A config the builder
    cannot take is a ValueError naming the option, the file, the key and the fix."""
    option = "--hf-config"
    if hf_config is None and model.endswith(".json") and Path(model).is_file():
        try:
            data = json.loads(Path(model).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict) and "model_type" in data:
            hf_config, option = model, "--model"
    if hf_config is None:
        return model
    where = f"{option} {hf_config}"
    try:
        return hf_card(hf_config)
    except HFUnavailable as exc:  # the optional extra is not installed: bad input for this command, with the fix
        raise ValueError(f"{where}: {exc}") from None
    except HFConfigProblem as exc:
        key = exc.key.removeprefix("model.hf").lstrip(".")
        named = f"{key}: " if key and key != "model_type" else ""  # a model_type problem names it itself
        raise ValueError(f"{where}: {named}{exc.problem}" + (f"; {exc.fix}" if exc.fix else "")) from None
    except ValueError as exc:
        raise ValueError(f"{where}: {str(exc).removeprefix('model.hf: ')}") from None


class MetaBatchTrainer(Trainer):
    """A trainer whose token batches are born on ``meta`` when the model is there: ``training.make_batch`` draws
    the tokens on the host and then moves them, so a simulated batch of a million sequences would first fill tens
    of GB of host memory (and a failed allocation read as "does not fit"). On meta the token values are never read,
    only their shapes, and the meta tensors are the ones the move made (an int64 ``(batch, seq + 1)`` tensor and its
    two contiguous slices), so the simulated step and its peak are unchanged."""

    def batch(self, position: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        device = next(self.model.parameters()).device
        if device.type != "meta":
            return super().batch(position)
        tokens = torch.empty((self.batch_size, self.seq_len + 1), dtype=torch.int64, device=device)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def simulated_trainer(model, batch_size: int, seq_len: int, target: str, seed: int = 0,
                      autocast: torch.dtype | None = None, impl: StepImpl | None = None) -> Trainer:
    """The trainer a run on ``target`` has: CUDA's default AdamW is the multi-tensor (foreach) one; on a CPU (and
    on meta) PyTorch picks per-tensor, so a ``cuda`` prediction asks for foreach explicitly. Its batches are made
    on meta (``MetaBatchTrainer``): no host memory for any batch size. ``impl``: the optimizer and loss
    (``config.step_impl``; an optimizer named foreach or fused is that one on every target)."""
    return MetaBatchTrainer.create(model, batch_size, seq_len, seed=seed, foreach=True if target == "cuda" else None,
                                   autocast=autocast, impl=impl)
