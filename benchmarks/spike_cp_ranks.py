"""Spike for issue 32 (context parallel on measured ranks, composed with FSDP and tensor parallel): does torch's own
ring attention run on CPU gloo ranks, train what one process trains, and hold what the simulated rank holds?

    python benchmarks/spike_cp_ranks.py            # 4 gloo ranks, writes reports/spike-cp-ranks.md (+ .json)
    python benchmarks/spike_cp_ranks.py --print

torch's ``context_parallel`` context manager does not run on a CPU (the CPU flash op has no ring dispatch), so
context parallel was simulated only, on ``meta`` with the CUDA flash op, and labelled "modelled". The ring itself
(``_templated_ring_attention`` and its backward) takes the attention op as an argument;
``distributed.context_parallel`` runs it with the CPU flash op and its backward. One torchrun launch of 4 ranks
builds each layout with the project's builder (``tensor_parallel.build_trainer``: FSDP2 over the flattened
``dp_shard x cp`` mesh, tensor parallel inside, the sequence sharded by torch's ``_context_parallel_shard`` with
its head-tail load balancer, the tokens' own positions):

- **training**: the first step's loss (the mean over ranks of each rank's local mean: equal token counts) and every
  parameter's gradient (FSDP2's reduced shard, gathered) against one process on the whole batch and sequence;
- **memory**: a warm step, then three probed steps (the rank probe, ``distributed.memory``), each window against
  the same rank simulated by the real engine under fake mode (``simulate.fake_ranks.simulate_rank``: the same
  builder, the fake process group, the ring with the same op), in this process after the launch.

Layouts: ``cp 4``, ``dp_shard 2 x cp 2``, ``cp 2 x tp 2`` and ``dp_replicate 2 x cp 2`` (HSDP: FSDP2 over the 2D
``(dp_replicate, dp_shard_cp)`` mesh, replicas of the cp group) on a Llama card (grouped-query attention, rotary
positions) and ``cp 4`` on a GPT card (learned positions); ``none`` and ``full``; fp32. Recorded, not asserted.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from report_output import (  # noqa: E402 (benchmarks/ on the path first)
    add_twins,
    gloo_rank_records,
    gradient_gaps,
    one_process_step,
    gloo_spike_main,
    gloo_spike_ranks,
    report_text,
    twin_cells,
    TWIN_WINDOWS,
)

WORLD = 4
WINDOWS = TWIN_WINDOWS  # (the test reads them here)
LLAMA = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_kv_head": 2, "intermediate_size": 88, "vocab_size": 256,
         "block_size": 64}
GPT = {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256, "block_size": 64}
BATCH, SEQ, SEED = 2, 64, 1
STRATEGIES = ("none", "full")
REPEATS = 3
CASES = {  # name -> (card, overrides, dp_shard, cp, tp, dp_replicate)
    "llama cp 4": ("llama-tiny", LLAMA, 1, 4, 1, 1),
    "llama dp_shard 2 x cp 2": ("llama-tiny", LLAMA, 2, 2, 1, 1),
    "llama cp 2 x tp 2": ("llama-tiny", LLAMA, 1, 2, 2, 1),
    "gpt cp 4": ("tiny", GPT, 1, 4, 1, 1),
    "llama dp_replicate 2 x cp 2": ("llama-tiny", LLAMA, 1, 2, 1, 2),
}


def _layout(case: str):
    from pytest_flashckpt.config.layout import Layout

    _, _, dp, cp, tp, replicas = CASES[case]
    return Layout(dp_shard=dp, cp=cp, tp=tp, dp_replicate=replicas)


def _card(case: str):
    from pytest_flashckpt.models.cards import load_card

    name, overrides, *_ = CASES[case]
    return load_card(name, **overrides)


def run_case(case: str, strategy: str) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from pytest_flashckpt.config.scenario import ActivationConfig
    from pytest_flashckpt.distributed import tensor_parallel as tp

    card, layout = _card(case), _layout(case)
    ref_loss, ref_grads = one_process_step(card, BATCH, SEQ, SEED)
    mesh = tp.make_mesh(layout)
    trainer, _ = tp.build_trainer(card, layout, mesh, batch_size=BATCH, seq_len=SEQ, seed=SEED,
                                  activation=ActivationConfig(strategy))
    loss = tp.forward_backward(trainer)
    loss = (loss.full_tensor() if isinstance(loss, DTensor) else loss).clone()  # tp: loss_parallel's replicated loss
    dist.all_reduce(loss)
    worst_abs, worst_rel = gradient_gaps(trainer.model, ref_grads)
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.train_step()  # the warm step: AdamW's state made
    windows = [tp.memory_step(trainer) for _ in range(REPEATS)]
    placements = str(tuple(next(trainer.model.parameters()).placements))  # HSDP: (Replicate(), Shard(dim=0))
    return {"loss": float(loss) / dist.get_world_size(), "reference_loss": ref_loss, "grad_max_abs": worst_abs,
            "grad_max_rel": worst_rel, "windows": windows, "backend": getattr(trainer.model.config, "name", ""),
            "placements": placements}


def gloo_rank(out: Path) -> None:
    gloo_rank_records(out, "cases", {f"{case} | {strategy}": functools.partial(run_case, case, strategy)
                                     for case in CASES for strategy in STRATEGIES})


def measure() -> list[dict]:
    return gloo_spike_ranks(__file__, WORLD)


def simulate(ranks: list[dict]) -> None:
    """Each measured rank's simulated twin (``simulate.fake_ranks.simulate_rank``), added to its record."""
    from pytest_flashckpt.config.scenario import ActivationConfig  # noqa: F401 (the builder's config, imported early)
    from pytest_flashckpt.simulate.fake_ranks import simulate_rank

    add_twins((rank["cases"][f"{case} | {strategy}"],
               functools.partial(simulate_rank, _card(case), _layout(case), batch_size=BATCH, seq_len=SEQ,
                                 strategy=strategy, rank=rank["rank"], seed=SEED, extrapolate=False, warmup="step"))
              for case in CASES for strategy in STRATEGIES for rank in ranks)


def render(ranks: list[dict], produced: str) -> str:
    lines = ["# Spike: context parallel on gloo ranks, with FSDP and tensor parallel (issue 32)", "", produced, "",
             f"{WORLD} gloo ranks; batch {BATCH} x {SEQ} tokens, fp32, seed {SEED}; Llama card `llama-tiny` with "
             f"`{json.dumps(LLAMA)}`, GPT card `tiny` with `{json.dumps(GPT)}`. torch's ring attention "
             "(`_templated_ring_attention`, all-gather rotation, head-tail load balance) with the CPU flash op "
             "(`distributed.context_parallel`); FSDP2 over the flattened `dp_shard x cp` mesh (with `dp_replicate`, HSDP "
             "over `(dp_replicate, dp_shard_cp)`). Loss: the mean of "
             "the ranks' local means; gradients: FSDP2's reduced shards gathered, against one process on the whole "
             f"batch. Memory: rank probe after a warm step, {REPEATS} repeats (min-max where they moved), against "
             "the simulated rank (`simulate.fake_ranks`, fake mode, same builder).", "",
             "| layout | strategy | rank | loss / one process | gradient max abs diff (rel. norm) | fwd+bwd start -> "
             "peak (measured) | simulated | optimizer start -> peak (measured) | simulated | simulated - measured |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    equal, total, errors, worst_grad, worst_loss = 0, 0, [], 0.0, 0.0
    for case in CASES:
        for strategy in STRATEGIES:
            for rank in ranks:
                r = rank["cases"][f"{case} | {strategy}"]
                if "error" in r:
                    errors.append(f"- {case}, {strategy}, rank {rank['rank']}: `{r['error']}`")
                    continue
                same, cells = twin_cells(r)
                if same is None:
                    errors.append(f"- {case}, {strategy}, rank {rank['rank']} (simulated): `{r['simulated']['error']}`")
                total, equal = total + (same is not None), equal + bool(same)
                worst_grad = max(worst_grad, r["grad_max_abs"])
                worst_loss = max(worst_loss, abs(r["loss"] - r["reference_loss"]))
                lines.append(f"| {case} | {strategy} | {rank['rank']} | {r['loss']:.7f} / {r['reference_loss']:.7f} | "
                             f"{r['grad_max_abs']:.1e} ({r['grad_max_rel']:.1e}) | {' | '.join(cells)} |")
    lines += ["", "## What it says", "",
              f"- Training: the loss is within {worst_loss:.1e} of one process's and every gradient within "
              f"{worst_grad:.1e} (absolute), over every layout, strategy and rank that ran.",
              f"- Memory: in {equal} of {total} rank x layout x strategy cases every window of the simulated rank "
              "(start and peak, forward+backward and optimizer) equals the measured rank's lowest repeat to the byte."]
    return report_text(lines, errors)


def main() -> None:
    def measured_and_simulated() -> list[dict]:
        ranks = measure()
        simulate(ranks)
        return ranks

    gloo_spike_main(__doc__, __file__, gloo_rank, measured_and_simulated, render)


if __name__ == "__main__":
    main()
