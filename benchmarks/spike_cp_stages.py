"""Spike for issue 32 (context parallel inside pipeline stages, torchtitan's composition): do pipeline stages whose
blocks run torch's ring attention train what one process trains, and hold what the same stage rank simulated by the
engine holds?

    python benchmarks/spike_cp_stages.py            # 4 gloo ranks, writes reports/spike-cp-stages.md (+ .json)
    python benchmarks/spike_cp_stages.py --print

One torchrun launch of 4 ranks, ``pp 2 x cp 2`` (mesh ``(pp, dp_shard, cp, tp)``), built by the project's
``pipeline.build_pipeline``: each stage's blocks run the ring over the cp ranks of their pipeline rank
(``distributed.context_parallel``), the tokens and targets are the cp rank's head-tail share and every stage is
given those tokens' positions for the step, the cp rank's share of the hidden states flows between stages, FSDP2
shards each stage over the flattened ``dp_shard x cp``.

- **training**: the first step's loss (the last stage's, the mean of its microbatches' local means, averaged over the
  cp ranks) and every parameter's gradient (FSDP2's reduced shard, gathered) against one process on the whole batch
  and sequence;
- **memory**: a warm step, then three probed steps (``pipeline.memory_step``), each window against the same rank
  simulated by the real engine under fake mode (``simulate.pipeline.simulate_pipeline_rank``, warmed up by a real
  step as the gloo rank was), in this process after the launch.

A Llama card of 4 blocks; 1F1B over 2 microbatches and interleaved 1F1B (2 stages per rank, 4 microbatches);
``none`` and ``full``; fp32. Recorded, not asserted (``tests/distributed/test_cp_stages.py`` asserts).
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
    TWIN_WINDOWS,
    add_twins,
    gloo_rank_records,
    gradient_gaps,
    one_process_step,
    gloo_spike_main,
    gloo_spike_ranks,
    report_text,
    twin_cells,
)

WORLD = 4
WINDOWS = TWIN_WINDOWS  # (the test reads them here)
CARD = {"n_layer": 4, "n_embd": 64, "n_head": 4, "n_kv_head": 2, "intermediate_size": 88, "vocab_size": 256,
        "block_size": 64}
BATCH, SEQ, SEED = 4, 64, 1
STRATEGIES = ("none", "full")
SCHEDULES = {"1f1b": (2, 1), "interleaved_1f1b": (4, 2)}  # schedule -> (microbatches, stages per rank)
REPEATS = 3


def _layout():
    from pytest_flashckpt.config.layout import Layout

    return Layout(dp_shard=1, pp=2, cp=2)


def _card():
    from pytest_flashckpt.models.cards import load_card

    return load_card("llama-tiny", **CARD)


def _pipeline(schedule: str):
    from pytest_flashckpt.config.layout import PipelineSchedule

    microbatches, per_rank = SCHEDULES[schedule]
    return PipelineSchedule(schedule, microbatches, per_rank)


def run_case(schedule: str, strategy: str) -> dict:
    import torch
    import torch.distributed as dist

    from pytest_flashckpt.config.scenario import ActivationConfig
    from pytest_flashckpt.distributed import context_parallel
    from pytest_flashckpt.distributed import pipeline as pp
    from pytest_flashckpt.models.cards import build_model

    card, layout = _card(), _layout()
    ref_loss, ref_grads = one_process_step(card, BATCH, SEQ, SEED)
    mesh = pp.make_mesh(layout)

    def build():
        model = build_model(card, context_parallel.ring_backend("cpu"), "cpu", torch.float32, seed=SEED)
        return pp.build_pipeline(model, layout, mesh, _pipeline(schedule), batch_size=BATCH, seq_len=SEQ, seed=SEED,
                                 activation=ActivationConfig(strategy))

    trainer = build()
    loss = trainer.forward_backward()
    total = torch.tensor([0.0 if loss is None else float(loss), 0.0 if loss is None else 1.0])
    dist.all_reduce(total)  # the last stage's cp ranks: the mean of their local means (equal token counts)
    worst_abs, worst_rel = gradient_gaps(trainer.model, ref_grads)
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.train_step()  # the warm step: AdamW's state made
    windows = [pp.memory_step(trainer) for _ in range(REPEATS)]
    return {"loss": float(total[0] / total[1]), "reference_loss": ref_loss, "grad_max_abs": worst_abs,
            "grad_max_rel": worst_rel, "windows": windows, "stages": windows[0]["stages"]}


def gloo_rank(out: Path) -> None:
    gloo_rank_records(out, "cases", {f"{schedule} | {strategy}": functools.partial(run_case, schedule, strategy)
                                     for schedule in SCHEDULES for strategy in STRATEGIES})


def measure() -> list[dict]:
    return gloo_spike_ranks(__file__, WORLD)


def simulate(ranks: list[dict]) -> None:
    """Each measured rank's simulated twin (``simulate.pipeline.simulate_pipeline_rank``), added to its record."""
    from pytest_flashckpt.simulate.pipeline import simulate_pipeline_rank

    add_twins((rank["cases"][f"{schedule} | {strategy}"],
               functools.partial(simulate_pipeline_rank, _card(), _layout(), _pipeline(schedule), batch_size=BATCH,
                                 seq_len=SEQ, strategy=strategy, rank=rank["rank"], seed=SEED, extrapolate=False,
                                 warmup="step"))
              for schedule in SCHEDULES for strategy in STRATEGIES for rank in ranks)


def measured_and_simulated() -> list[dict]:
    ranks = measure()
    simulate(ranks)
    return ranks


def render(ranks: list[dict], produced: str) -> str:
    lines = ["# Spike: context parallel inside pipeline stages (issue 32)", "", produced, "",
             f"{WORLD} gloo ranks, `pp 2 x cp 2`; batch {BATCH} x {SEQ} tokens, fp32, seed {SEED}; Llama card "
             f"`llama-tiny` with `{json.dumps(CARD)}`. Each stage's blocks run torch's ring attention "
             "(`_templated_ring_attention`, all-gather rotation, head-tail load balance) with the CPU flash op over "
             "the cp ranks of their pipeline rank; FSDP2 over each stage group's flattened `dp_shard x cp`. Loss: the "
             "last stage's cp ranks' mean; gradients: FSDP2's reduced shards gathered, against one process on the "
             f"whole batch. Memory: `pipeline.memory_step` after a warm step, {REPEATS} repeats (min-max where they "
             "moved), against the rank simulated by the engine (`simulate.pipeline`, fake mode, same builder).", "",
             "| schedule | strategy | rank (stages) | loss / one process | gradient max abs diff (rel. norm) | fwd+bwd "
             "start -> peak (measured) | simulated | optimizer start -> peak (measured) | simulated | simulated - "
             "measured |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    equal, total, errors, worst_grad, worst_loss = 0, 0, [], 0.0, 0.0
    for schedule in SCHEDULES:
        for strategy in STRATEGIES:
            for rank in ranks:
                r = rank["cases"][f"{schedule} | {strategy}"]
                if "error" in r:
                    errors.append(f"- {schedule}, {strategy}, rank {rank['rank']}: `{r['error']}`")
                    continue
                same, cells = twin_cells(r)
                if same is None:
                    errors.append(f"- {schedule}, {strategy}, rank {rank['rank']} (simulated): `{r['simulated']['error']}`")
                total, equal = total + (same is not None), equal + bool(same)
                worst_grad = max(worst_grad, r["grad_max_abs"])
                worst_loss = max(worst_loss, abs(r["loss"] - r["reference_loss"]))
                lines.append(f"| {schedule} | {strategy} | {rank['rank']} ({', '.join(map(str, r['stages']))}) | "
                             f"{r['loss']:.7f} / {r['reference_loss']:.7f} | "
                             f"{r['grad_max_abs']:.1e} ({r['grad_max_rel']:.1e}) | {' | '.join(cells)} |")
    lines += ["", "## What it says", "",
              f"- Training: the loss is within {worst_loss:.1e} of one process's and every gradient within "
              f"{worst_grad:.1e} (absolute), over every schedule, strategy and rank that ran.",
              f"- Memory: in {equal} of {total} rank x schedule x strategy cases every window of the simulated rank "
              "(start and peak, forward+backward and optimizer) equals the measured rank's lowest repeat to the byte."]
    return report_text(lines, errors)


def main() -> None:
    gloo_spike_main(__doc__, __file__, gloo_rank, measured_and_simulated, render)


if __name__ == "__main__":
    main()
