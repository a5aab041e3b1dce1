"""Spike for issue 32 (compiled context-parallel ranks): does a block that calls torch's ring attention compile per
block on gloo ranks without a graph break, train as the eager rank trains, and hold what the compiled rank
simulated by the real engine holds?

    python benchmarks/spike_compiled_cp_ranks.py            # 4 gloo ranks, writes reports/spike-compiled-cp-ranks.md (+ .json)
    python benchmarks/spike_compiled_cp_ranks.py --print

The riskiest step, tried first on 2 ranks: Dynamo traced the ring's forward but broke the graph at its backward,
which calls the CPU flash op's backward with keywords, one of them the forward output named ``out``; Dynamo takes
a keyword ``out`` for an ``out=`` tensor ("Attempted to call op with non-contiguous `out=` tensor", 4 breaks a
step). ``distributed.context_parallel`` passes the ring a function that calls the op positionally: no break.

One torchrun launch of 4 ranks. Per case (the layouts of reports/spike-cp-ranks.md, each with a strategy that
compiles there: under tensor parallel the checkpoint wraps the compiled block, ``compile.ac_wrapper: outside``):

- **training**: the first step's loss and every gradient of the compiled rank against the eager rank of the same
  layout (each block compiled before ``fully_shard`` by ``compile_step.compile_model``, as ``distributed.rank``
  compiles it; the eager rank trains as one process, reports/spike-cp-ranks.md), and the graph breaks of that step;
- **memory**: the scenario's own rank (``distributed.rank.measure``: warm-up checked for breaks and regions, the
  step's peak from the CPU allocator's events, the next step's windows by the rank probe made to run under compiled
  code), against the same rank simulated by the engine compiled under fake mode (``simulate.fake_ranks.simulate_rank``
  with the scenario's ``compile``: Inductor's own plans, kernels stubbed), in this process after the launch.

Llama card ``llama-tiny`` as the distributed suite runs it, batch 4 x 64 tokens, fp32. Recorded, not asserted
(``tests/distributed/test_compiled_cp_ranks.py`` asserts).
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
    report_text,
    scenario_twin_cells,
    scenario_windows,
    with_scenario_twins,
)

WORLD = 4
BATCH, SEQ = 4, 64
WINDOWS = SCENARIO_WINDOWS  # (the test reads them here)
CASES = {  # name -> (dp_shard, cp, tp, dp_replicate, strategy, ac_wrapper)
    "cp 4 | none": (1, 4, 1, 1, "none", "inside"),
    "cp 4 | full": (1, 4, 1, 1, "full", "inside"),
    "dp_shard 2 x cp 2 | selective_op": (2, 2, 1, 1, "selective_op", "inside"),
    "cp 2 x tp 2 | full (outside)": (1, 2, 2, 1, "full", "outside"),
    "dp_replicate 2 x cp 2 | full": (1, 2, 1, 2, "full", "inside"),
}


def scenario_of(case: str):
    from pytest_flashckpt.config.axes import CompileConfig, LayoutMesh
    from pytest_flashckpt.config.scenario import ActivationConfig, SaveConfig, Scenario

    dp, cp, tp, replicas, strategy, wrapper = CASES[case]
    name = "".join(ch if ch.isalnum() else "-" for ch in case.lower())
    return Scenario(name, model="llama-tiny", world_size=WORLD, batch_size=BATCH, seq_len=SEQ,
                    layout=LayoutMesh(dp_shard=dp, cp=cp, tp=tp, dp_replicate=replicas),
                    activation=ActivationConfig(strategy), compile=CompileConfig(scope="block", ac_wrapper=wrapper),
                    save=SaveConfig(strategy="none"), measure=("memory",), warmup=2)


def _first_step(scenario, compiled: bool) -> tuple[float, list]:
    """The layout's first forward and backward, eager or each block compiled as ``distributed.rank`` compiles it:
    the loss and every gradient (gathered)."""
    import torch
    from torch.distributed.tensor import DTensor

    from pytest_flashckpt import compile_step
    from pytest_flashckpt.distributed import tensor_parallel as tp
    from pytest_flashckpt.models.cards import load_card
    from pytest_flashckpt.probes.compiled import dynamos_hidden_warnings

    torch._dynamo.reset()
    layout = scenario.parallel_layout

    def compile_blocks(model) -> None:
        if layout.tp > 1:
            tp.settle_embedding_output(model)
        compile_step.compile_model(model, scenario.compile)

    trainer, _ = tp.build_trainer(load_card(scenario.card), layout, tp.make_mesh(layout), batch_size=BATCH,
                                  seq_len=SEQ, seed=scenario.seed, activation=scenario.activation,
                                  before_shard=compile_blocks if compiled else None)
    with dynamos_hidden_warnings():  # (torch's own tracing warnings, as a compiled rank's steps run)
        loss = tp.forward_backward(trainer)
    loss = loss.full_tensor() if isinstance(loss, DTensor) else loss
    grads = [(p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).clone() for p in trainer.model.parameters()]
    return float(loss), grads


def run_case(case: str) -> dict:
    import tempfile

    import torch

    from pytest_flashckpt import compile_step
    from pytest_flashckpt.distributed import rank as rank_module

    scenario = scenario_of(case)
    eager_loss, eager_grads = _first_step(scenario, compiled=False)
    compiled_loss, compiled_grads = _first_step(scenario, compiled=True)
    graphs, _, breaks = compile_step.dynamo_counts()
    worst = max(float((a - b).abs().max()) for a, b in zip(eager_grads, compiled_grads))
    with tempfile.TemporaryDirectory() as tmp:
        measured = rank_module.measure(scenario, torch.device("cpu"), "cpu", Path(tmp))
    return {"eager_loss": eager_loss, "compiled_loss": compiled_loss, "grad_max_abs_vs_eager": worst,
            "first_step_graphs": graphs, "first_step_breaks": sum(breaks.values()), "break_reasons": list(breaks)[:2],
            **{k: measured.get(k) for k in (*WINDOWS, "peak_bytes", "compiled_regions", "recompiles",
                                              "largest_allgather_bytes", "activation")}}


def gloo_rank(out: Path) -> None:
    gloo_rank_records(out, "cases", {case: functools.partial(run_case, case) for case in CASES})


def measure() -> list[dict]:
    return gloo_spike_ranks(__file__, WORLD)


def compiled_twin(case: str, rank: int) -> dict:
    """Rank ``rank`` of ``case`` simulated compiled (``simulate.fake_ranks.simulate_rank`` with the scenario's
    compile): its windows under the names the scenario's rank records."""
    import torch

    from pytest_flashckpt.models.cards import load_card
    from pytest_flashckpt.simulate.fake_ranks import simulate_rank

    scenario = scenario_of(case)
    record = simulate_rank(load_card(scenario.card), scenario.parallel_layout, batch_size=BATCH, seq_len=SEQ,
                           strategy=scenario.activation.strategy, dtype=torch.float32, seed=scenario.seed, rank=rank,
                           compile=scenario.compile)
    return {**scenario_windows(record), "seconds": sum(record[k] for k in ("layout_s", "warm_step_s", "measured_step_s"))}


def measured_and_simulated() -> list[dict]:
    """Each measured rank with its compiled twin (``compiled_twin``) added to its record."""
    return with_scenario_twins(measure(), CASES, compiled_twin)


def render(ranks: list[dict], produced: str) -> str:
    lines = ["# Spike: compiled context-parallel ranks (issue 32)", "", produced, "",
             f"{WORLD} gloo ranks; `llama-tiny`, batch {BATCH} x {SEQ} tokens, fp32; every block compiled before "
             "`fully_shard` (`compile.scope: block`), torch's ring attention with the CPU flash op "
             "(`distributed.context_parallel`). Training: the compiled rank's first step against the eager rank's "
             "(loss, gradients gathered) and that step's graph breaks. Memory: the scenario's own rank "
             "(`distributed.rank.measure`, the rank probe under compiled code) against the rank simulated by the "
             "engine compiled under fake mode.", "",
             "| layout \\| strategy | rank | loss compiled / eager | gradient max abs diff | graph breaks | regions "
             "a step | state (measured / simulated) | fwd+bwd peak (measured / simulated) | optimizer peak (measured / "
             "simulated) | largest all-gather | allocator peak | simulated - measured |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    equal, total, errors, worst, breaks = 0, 0, [], 0.0, 0
    for case in CASES:
        for rank in ranks:
            r = rank["cases"][case]
            if "error" in r:
                errors.append(f"- {case}, rank {rank['rank']}: `{r['error']}`")
                continue
            worst = max(worst, r["grad_max_abs_vs_eager"])
            breaks += r["first_step_breaks"]
            same, gap, pairs = scenario_twin_cells(r)
            if same is None:
                errors.append(f"- {case}, rank {rank['rank']} (simulated): `{r['simulated']['error']}`")
            total, equal = total + (same is not None), equal + bool(same)
            lines.append(f"| {case} | {rank['rank']} | {r['compiled_loss']:.7f} / {r['eager_loss']:.7f} | "
                         f"{r['grad_max_abs_vs_eager']:.1e} | {r['first_step_breaks']} | {r['compiled_regions']} | "
                         f"{' | '.join(pairs)} | {r['largest_allgather_bytes']:,} | {r['peak_bytes']:,} | {gap} |")
    lines += ["", "## What it says", "",
              f"- Training: {breaks} graph breaks over every case and rank; every compiled gradient within {worst:.1e} "
              "of the eager rank's (absolute).",
              f"- Memory: in {equal} of {total} rank x case pairs the simulated compiled rank's state, forward+backward "
              "peak and optimizer peak equal the measured rank's probe to the byte."]
    return report_text(lines, errors)


def main() -> None:
    gloo_spike_main(__doc__, __file__, gloo_rank, measured_and_simulated, render)


if __name__ == "__main__":
    main()
