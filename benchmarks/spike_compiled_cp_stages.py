"""Spike for issue 32 (compiled pipeline stages with context parallel inside, the last composition it refused):
do pipeline stages whose blocks call torch's ring attention train with every block compiled (after the activation
strategy, before ``fully_shard``: torchtitan's order) as one process trains, without a graph break, and hold what the
same stage rank simulated compiled by the engine holds?

    python benchmarks/spike_compiled_cp_stages.py            # 4 gloo ranks, writes reports/spike-compiled-cp-stages.md (+ .json)
    python benchmarks/spike_compiled_cp_stages.py --print

One torchrun launch of 4 ranks, ``pp 2 x cp 2`` (reports/spike-cp-stages.md ran it eager; reports/spike-compiled-cp-
ranks.md compiled the ring's blocks without stages). Per case:

- **training**: the first step of the stages built as the scenario's rank builds them (``distributed.rank.build_stages``),
  eager and with every block compiled (``compile_step.compile_model``): the loss (the last stage's cp ranks' mean of
  their microbatches' local means) and every gradient (FSDP2's reduced shard, gathered) against one process on the
  whole batch and sequence, and the compiled step's graph breaks;
- **memory**: the scenario's own rank (``distributed.rank.measure``: warm-up checked for breaks and regions, the
  next step's windows by the rank probe run under compiled code), against the same stage rank simulated by the engine
  compiled under fake mode (``simulate.pipeline.simulate_pipeline_rank`` with the scenario's ``compile``), in this
  process after the launch.

``llama-tiny`` as the distributed suite runs it (3 blocks: 2 on the first stage, 1 on the last), batch 4 x 64
tokens, fp32. Recorded, not asserted (``tests/distributed/test_compiled_cp_stages.py`` asserts).

Found by this spike, in the engine: the fake rank's functional collectives were waited on as an eager real rank
waits (``simulate.fake_ranks._waited_as_a_real_rank``), also while Dynamo traced a compiled block, so its graph had
no ``wait_tensor`` and Inductor issued the ring's all-gather of a recomputed backward earlier than the gloo rank's
graph did. Traced, the wait is torch's now, and the fake rank hands a compiled region's ``wait_tensor`` its input
back as a real rank does (``simulate.rank_probe``). An op-by-op comparison of rank 0's forward+backward window
(``1f1b x 2 | full``) then reads the same ops and the same live bytes on both ranks, but for where gloo's thread
still holds a finished collective and one more: gloo's reduce-scatter copies its input (a stage group's padded
gradients, the size of that group's all-gather) into a buffer of its own, which the rank probe sees as a split's
input. ``full``'s peak falls there on the first stage, so its gap is the same in every run; NCCL reduce-scatters
in place.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from report_output import (  # noqa: E402 (benchmarks/ on the path first)
    SCENARIO_WINDOWS,
    gloo_rank_records,
    gloo_spike_main,
    gloo_spike_ranks,
    gradient_gaps,
    one_process_step,
    report_text,
    scenario_twin_cells,
    scenario_windows,
    with_scenario_twins,
)

WORLD = 4
BATCH, SEQ = 4, 64
WINDOWS = SCENARIO_WINDOWS
CASES = {  # name -> (schedule, microbatches, strategy)
    "1f1b x 2 | none": ("1f1b", 2, "none"),
    "1f1b x 2 | full": ("1f1b", 2, "full"),
    "1f1b x 2 | selective_op": ("1f1b", 2, "selective_op"),
    "gpipe x 4 | full": ("gpipe", 4, "full"),
}


def scenario_of(case: str):
    from pytest_flashckpt.config.axes import CompileConfig, LayoutMesh
    from pytest_flashckpt.config.scenario import ActivationConfig, SaveConfig, Scenario

    schedule, microbatches, strategy = CASES[case]
    name = "".join(ch if ch.isalnum() else "-" for ch in case.lower())
    return Scenario(name, model="llama-tiny", world_size=WORLD, batch_size=BATCH, seq_len=SEQ,
                    layout=LayoutMesh(pp=2, cp=2, schedule=schedule, microbatches=microbatches),
                    activation=ActivationConfig(strategy), compile=CompileConfig(scope="block"),
                    save=SaveConfig(strategy="none"), measure=("memory",), warmup=2)


def _first_step(scenario, reference: dict, compiled: bool) -> dict:
    """The stages' first forward and backward, eager or each block compiled as ``distributed.rank`` compiles it:
    the loss (averaged over the last stage's cp ranks, every rank told it) and the gradients' gaps to one process."""
    import torch
    import torch.distributed as dist

    from pytest_flashckpt import compile_step
    from pytest_flashckpt.distributed import context_parallel, pipeline
    from pytest_flashckpt.distributed.rank import build_stages
    from pytest_flashckpt.probes.compiled import dynamos_hidden_warnings

    torch._dynamo.reset()
    mesh = pipeline.make_mesh(scenario.parallel_layout)
    compile_blocks = functools.partial(compile_step.compile_model, config=scenario.compile)
    trainer = build_stages(scenario, torch.device("cpu"), context_parallel.ring_backend("cpu"), mesh,
                           compile_blocks if compiled else None)
    with dynamos_hidden_warnings():  # (torch's own tracing warnings, as a compiled rank's steps run)
        loss = trainer.forward_backward()
    total = torch.tensor([0.0 if loss is None else float(loss), 0.0 if loss is None else 1.0])
    dist.all_reduce(total)  # the last stage's cp ranks: the mean of their local means (equal token counts)
    worst_abs, worst_rel = gradient_gaps(trainer.model, reference)
    return {"loss": float(total[0] / total[1]), "grad_max_abs": worst_abs, "grad_max_rel": worst_rel,
            "breaks": sum(compile_step.dynamo_counts()[2].values()), "break_reasons": list(compile_step.dynamo_counts()[2])[:2]}


def run_case(case: str) -> dict:
    import tempfile

    import torch

    from pytest_flashckpt.distributed import rank as rank_module
    from pytest_flashckpt.models.cards import load_card

    scenario = scenario_of(case)
    reference_loss, reference = one_process_step(load_card(scenario.card), BATCH, SEQ, scenario.seed)
    eager = _first_step(scenario, reference, compiled=False)
    compiled = _first_step(scenario, reference, compiled=True)
    with tempfile.TemporaryDirectory() as tmp:
        measured = rank_module.measure(scenario, torch.device("cpu"), "cpu", Path(tmp))
    return {"reference_loss": reference_loss, "eager": eager, "compiled": compiled,
            **{k: measured.get(k) for k in (*WINDOWS, "peak_bytes", "compiled_regions", "recompiles",
                                              "largest_allgather_bytes", "activation", "stages")}}


def gloo_rank(out: Path) -> None:
    gloo_rank_records(out, "cases", {case: functools.partial(run_case, case) for case in CASES})


def measure() -> list[dict]:
    return gloo_spike_ranks(__file__, WORLD)


def compiled_twin(case: str, rank: int) -> dict:
    """Rank ``rank`` of ``case`` simulated compiled (``simulate.pipeline.simulate_pipeline_rank`` with the
    scenario's compile): its windows under the names the scenario's rank records."""
    import torch

    from pytest_flashckpt.models.cards import load_card
    from pytest_flashckpt.simulate.pipeline import simulate_pipeline_rank

    scenario = scenario_of(case)
    record = simulate_pipeline_rank(load_card(scenario.card), scenario.parallel_layout,
                                    scenario.layout.pipeline_schedule(), batch_size=BATCH, seq_len=SEQ,
                                    strategy=scenario.activation.strategy, dtype=torch.float32, seed=scenario.seed,
                                    rank=rank, compile=scenario.compile)
    return scenario_windows(record)


def measured_and_simulated() -> list[dict]:
    """Each measured rank with its compiled twin (``compiled_twin``) added to its record."""
    return with_scenario_twins(measure(), CASES, compiled_twin)


def render(ranks: list[dict], produced: str) -> str:
    lines = ["# Spike: compiled pipeline stages with context parallel inside (issue 32)", "", produced, "",
             f"{WORLD} gloo ranks, `pp 2 x cp 2`; `llama-tiny`, batch {BATCH} x {SEQ} tokens, fp32; every block of "
             "each stage compiled before `fully_shard` (`compile.scope: block`), its attention torch's ring with the "
             "CPU flash op over the cp ranks of its pipeline rank. Training: the first step, eager and compiled, "
             "against one process on the whole batch (loss: the last stage's cp ranks' mean; gradients: FSDP2's "
             "reduced shards gathered), and the compiled step's graph breaks. Memory: the scenario's own rank "
             "(`distributed.rank.measure`, the rank probe under compiled code) against the stage rank simulated by "
             "the engine compiled under fake mode.", "",
             "| schedule \\| strategy | rank (stage) | loss compiled / eager / one process | gradient max abs diff "
             "compiled (eager) | graph breaks | regions a step | state (measured / simulated) | fwd+bwd peak "
             "(measured / simulated) | optimizer peak (measured / simulated) | largest all-gather | simulated - "
             "measured |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    equal, total, errors, worst, worst_loss, breaks, gaps = 0, 0, [], 0.0, 0.0, 0, []
    for case in CASES:
        for rank in ranks:
            r = rank["cases"][case]
            if "error" in r:
                errors.append(f"- {case}, rank {rank['rank']}: `{r['error']}`")
                continue
            compiled, eager = r["compiled"], r["eager"]
            worst = max(worst, compiled["grad_max_abs"])
            worst_loss = max(worst_loss, abs(compiled["loss"] - r["reference_loss"]))
            breaks += compiled["breaks"]
            same, gap, pairs = scenario_twin_cells(r)
            if same is None:
                errors.append(f"- {case}, rank {rank['rank']} (simulated): `{r['simulated']['error']}`")
            elif not same:
                gaps.append(r["fwd_bwd_peak_bytes"] - r["simulated"]["fwd_bwd_peak_bytes"])
            total, equal = total + (same is not None), equal + bool(same)
            lines.append(f"| {case} | {rank['rank']} ({rank['rank'] // (WORLD // 2)}) | {compiled['loss']:.7f} / {eager['loss']:.7f} / "
                         f"{r['reference_loss']:.7f} | {compiled['grad_max_abs']:.1e} ({eager['grad_max_abs']:.1e}) | "
                         f"{compiled['breaks']} | {r['compiled_regions']} | {' | '.join(pairs)} | "
                         f"{r['largest_allgather_bytes']:,} | {gap} |")
    lines += ["", "## What it says", "",
              f"- Training: {breaks} graph breaks over every case and rank; the compiled stages' loss within "
              f"{worst_loss:.1e} of one process's and every gradient within {worst:.1e} (absolute).",
              f"- Memory: in {equal} of {total} rank x case pairs the simulated compiled stage rank's state, "
              "forward+backward peak and optimizer peak equal the measured rank's probe to the byte."
              + (f" In the others the state and the optimizer peak are equal and the gloo rank's forward+backward "
                 f"peak is above by {min(gaps):,} to {max(gaps):,} B (the largest all-gather: "
                 f"{max(r['cases'][c]['largest_allgather_bytes'] for r in ranks for c in CASES if 'error' not in r['cases'][c]):,} B): "
                 "gloo's reduce-scatter staging and its thread (this script's docstring)." if gaps else "")]
    return report_text(lines, errors)


def main() -> None:
    gloo_spike_main(__doc__, __file__, gloo_rank, measured_and_simulated, render)


if __name__ == "__main__":
    main()
