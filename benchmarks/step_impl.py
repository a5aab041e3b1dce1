"""The step as users configure it (config.step_impl): norm, optimizer and loss, simulated at Llama-3-8B and measured
against the simulator on a CPU.

    PYTHONPATH=. python benchmarks/step_impl.py [--out reports/step-impl.md]

Llama-3-8B (``models/llama3-8b.yaml``), bf16, batch 1 x 8192 tokens, CUDA's flash kernel, simulated on meta
(``simulate_step``, what ``flashckpt simulate`` runs): one block's kept activations for each RMSNorm beside
Korthikanti et al.'s arithmetic on a Llama block (``activation.analytic.korthikanti_llama_terms``: the terms
between them, to the byte); the peak with the plain and the chunked loss (no checkpointing and full); the peak with
each optimizer under full checkpointing, where the optimizer step is the peak, and its state bytes per parameter.
Then each setting measured on a CPU (the exact cpu probe, fp32, SDPA) against its simulation on meta for that CPU,
on the two small Llama cards of tests/test_step_impl.py. Every number is computed here; none is typed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace

import torch

from pytest_flashckpt.activation.analytic import korthikanti_llama_block_bytes, korthikanti_llama_terms
from pytest_flashckpt.config.cards.llama import LlamaConfig
from pytest_flashckpt.config.step_impl import LOSSES, NORMS, OPTIMIZERS, STATE_TENSORS_PER_PARAMETER, StepImpl, card_with_norm
from pytest_flashckpt.core.files import atomic_write_text
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.probes.cpu import LiveTensorProbe
from pytest_flashckpt.simulate import simulate_step
from pytest_flashckpt.training import Trainer

CARD, DTYPE, BATCH, SEQ, KERNEL = "llama3-8b", "bf16", 1, 8192, "flash"
GIB = 2**30
# the cards of tests/test_step_impl.py: activations outweigh the optimizer (WIDE_VOCAB), or the reverse (WIDE_MODEL)
WIDE_VOCAB = LlamaConfig(name="step-impl-tiny", vocab_size=2048, block_size=256, n_layer=2, n_head=4, n_kv_head=2,
                         n_embd=64, intermediate_size=160)
WIDE_MODEL = LlamaConfig(name="step-impl-wide", vocab_size=512, block_size=64, n_layer=2, n_head=4, n_kv_head=2,
                         n_embd=128, intermediate_size=352)
CPU_CASES = [(WIDE_VOCAB, (2, 64), StepImpl()), (WIDE_VOCAB, (2, 64), StepImpl(norm="fused")),
             (WIDE_VOCAB, (2, 64), StepImpl(loss="chunked", loss_chunks=3)),
             *((WIDE_MODEL, (1, 16), StepImpl(optimizer=name)) for name in OPTIMIZERS)]


def simulated(impl: StepImpl, strategy: str = "none"):
    return simulate_step(CARD, DTYPE, BATCH, SEQ, KERNEL, strategy, impl=impl)


def gib(n: int) -> str:
    return f"{n / GIB:.2f}"


def norm_section() -> list[str]:
    card = load_card(CARD)
    tokens = BATCH * SEQ
    korthikanti = korthikanti_llama_block_bytes(card, BATCH, SEQ)
    lines = ["## One block's activations and Korthikanti's arithmetic, per RMSNorm", "",
             f"Korthikanti's arithmetic on a Llama block: 2 bytes x (6h + 2kv + 4i) per token = "
             f"{korthikanti // tokens:,} bytes a token ({gib(korthikanti)} GiB a block at {tokens:,} tokens; "
             f"h {card.n_embd}, kv {card.kv_dim}, i {card.intermediate_size}).", "",
             "| norm | simulated block (bytes) | per token | over Korthikanti | simulated - arithmetic = the terms | peak, no checkpointing (GiB) |",
             "| --- | ---: | ---: | ---: | --- | ---: |"]
    for norm in NORMS:
        sim = simulated(StepImpl(norm=norm))
        (block,) = set(sim.block_kept_bytes)
        terms = korthikanti_llama_terms(card, BATCH, SEQ, norm)
        exact = "exact" if sum(terms.values()) == block else f"off by {block - sum(terms.values()):,} bytes"
        extra = ", ".join(f"{name} {value:,}" for name, value in list(terms.items())[1:])
        lines.append(f"| {norm} | {block:,} | {block / tokens:,.0f} | {block / korthikanti - 1:+.1%} | {extra} ({exact}) | {gib(sim.peak_bytes)} |")
    lines += ["", f"Norms: {'; '.join(f'**{k}**: {v}' for k, v in NORMS.items())}.", ""]
    return lines


def loss_section() -> list[str]:
    lines = ["## The loss: plain vs chunked", "",
             "The chunked loss takes the logits, their log-softmax and their gradients off the loss backward "
             "('kept outside the blocks'); it lowers the step's peak only where the peak is there ('at'). The logits "
             "are bf16 here (pure bf16); a few bytes more with chunks: the chunked loss is one float32 scalar.", "",
             "| strategy | optimizer | loss | peak (GiB) | at | kept outside the blocks (GiB) | saving vs plain |",
             "| --- | --- | --- | ---: | --- | ---: | ---: |"]
    for strategy, optimizer in (("none", "adamw"), ("full", "adamw"), ("full", "adamw_fused")):
        plain = None
        for impl in (StepImpl(optimizer=optimizer), StepImpl(optimizer=optimizer, loss="chunked")):
            sim = simulated(impl, strategy)
            plain = plain or sim
            saved = plain.peak_bytes - sim.peak_bytes
            saving = "" if sim is plain else f"{gib(saved)} GiB ({saved / plain.peak_bytes:.1%}; {saved:,} bytes)"
            label = f"chunked x{impl.loss_chunks}" if impl.loss == "chunked" else impl.loss
            lines.append(f"| {strategy} | {optimizer} | {label} | {gib(sim.peak_bytes)} | {sim.peak_phase} ({sim.peak_op}) | "
                         f"{gib(sim.outside_kept_bytes)} | {saving} |")
    lines += ["", f"Losses: {'; '.join(f'**{k}**: {v}' for k, v in LOSSES.items())}.", ""]
    return lines


def optimizer_section() -> list[str]:
    params = load_card(CARD).num_params()
    lines = ["## The optimizer (full checkpointing: the optimizer step can peak)", "",
             "| optimizer | peak (GiB) | at | optimizer state (GiB) | state bytes / parameter | temporaries at the peak (GiB) |",
             "| --- | ---: | --- | ---: | ---: | ---: |"]
    for name in OPTIMIZERS:
        if name == "adamw_foreach":
            continue  # on a cuda target adamw is foreach already
        sim = simulated(StepImpl(optimizer=name), "full")
        state = sim.breakdown["optimizer_state"]
        lines.append(f"| {name} | {gib(sim.peak_bytes)} | {sim.peak_phase} ({sim.peak_op}) | {gib(state)} | "
                     f"{state / params:.2f} ({STATE_TENSORS_PER_PARAMETER[name]} x 2-byte tensors) | {gib(sim.breakdown['temporaries'])} |")
    lines += ["", f"Optimizers: {'; '.join(f'**{k}**: {v}' for k, v in OPTIMIZERS.items())}. On a cuda target `adamw` is "
              "`adamw_foreach`.", ""]
    return lines


def measured_cpu(card, shape, impl: StepImpl) -> tuple[int, int]:
    model = build_model(card_with_norm(card, impl.norm), "sdpa", "cpu", torch.float32)
    trainer = Trainer.create(model, *shape, impl=impl)
    trainer.train_step()
    with LiveTensorProbe().track(trainer.state_tensors()) as reading:
        trainer.train_step()
    return reading.peak_bytes, reading.start_bytes


def cpu_section() -> list[str]:
    lines = ["## Measured on a CPU vs simulated (exact bytes)", "",
             "| card | batch x seq | step | measured peak | simulated peak | measured start | simulated start | equal |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for card, shape, impl in CPU_CASES:
        peak, start = measured_cpu(card, shape, impl)
        sim = simulate_step(card, "float32", *shape, "sdpa", "none", target="cpu", impl=impl)
        equal = "yes" if (peak, start) == (sim.peak_bytes, sim.start_bytes) else "**no**"
        lines.append(f"| {card.name} | {shape[0]} x {shape[1]} | {impl.describe()} | {peak:,} | {sim.peak_bytes:,} | "
                     f"{start:,} | {sim.start_bytes:,} | {equal} |")
    return lines + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="reports/step-impl.md")
    args = parser.parse_args()
    started = time.perf_counter()
    lines = ["# The step as users configure it: norm, optimizer, loss", "",
             f"Generated by `PYTHONPATH=. python benchmarks/step_impl.py` (torch {torch.__version__}, {os.cpu_count()} CPUs, "
             f"load average at start {os.getloadavg()[0]:.1f}). {CARD}, {DTYPE}, batch {BATCH} x {SEQ} tokens, CUDA flash "
             "kernel, simulated on meta (`flashckpt simulate --model llama3-8b --seq 8192 --batch 1 --norm fused "
             "--optimizer adamw_fused --loss chunked` runs one of these). Defaults (a scenario or a command without the "
             "settings): the card's norm (`plain` on every shipped card), `adamw` (foreach on CUDA, per-tensor on a CPU), "
             "the `plain` loss.", ""]
    lines += norm_section() + loss_section() + optimizer_section() + cpu_section()
    lines.append(f"Took {time.perf_counter() - started:.0f} s; load average at the end {os.getloadavg()[0]:.1f}.")
    atomic_write_text(args.out, "\n".join(lines) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
