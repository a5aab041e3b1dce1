"""Spike for issue 32 (HSDP inside pipeline stages): does an HSDP rank hold what the FSDP rank of its shard group
holds, alone and inside pipeline stages? ``flashckpt fit`` simulates an HSDP candidate as the rank of its
``dp_shard`` group (``fit.memory``: "HSDP replicas add nothing to a rank"); this measures that claim on gloo ranks.

    python benchmarks/spike_hsdp_ranks.py            # 4 gloo ranks, writes reports/spike-hsdp-ranks.md
    python benchmarks/spike_hsdp_ranks.py --print

One torchrun launch of 4 ranks. Each configuration is built twice on the same ranks, from the same weights and
batch, with the project's own builders (``tensor_parallel.build_trainer``, ``pipeline.build_pipeline``, given the
layout with its ``dp_replicate`` and the mesh ``make_mesh`` builds for it):

- **FSDP** (the reference): ``fully_shard`` forced onto the mesh's ``dp_shard`` dimension only, so each replica
  trains on its own (as an FSDP run over the shard group's ranks would); both builds split the batch over the 4
  data-parallel ranks (``tensor_parallel.data_rank``, as HSDP does);
- **HSDP**: the builders' own sharding of a mesh with ``dp_replicate``: ``fully_shard`` over the 2D
  ``(dp_replicate, dp_shard)`` mesh, FSDP2's HSDP (gradients reduce-scattered in the shard group, then all-reduced
  across the replicas), torch's own.

Layouts: ``hsdp 2x2`` (mesh ``dp_replicate 2 x dp_shard 2``, fp32) and ``pp 2 x hsdp 2x1`` (mesh ``pp 2 x
dp_replicate 2 x dp_shard 1``, 1F1B over 2 microbatches, mixed precision so FSDP2 wraps each stage in both builds).
Per rank, one step in the two windows (forward + backward, optimizer) read by the rank probe
(``distributed.memory.ShardedLiveTensorProbe``) after a warm step, three repeats, and the loss. Then each HSDP
rank simulated by the real engine under fake mode (``simulate.fake_ranks``, ``simulate.pipeline``), in this
process after the launch. Recorded, not asserted (``tests/distributed/test_hsdp_ranks.py`` asserts).
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from report_output import (  # noqa: E402 (benchmarks/ on the path first)
    add_twins,
    byte_range,
    gloo_rank_records,
    gloo_spike_main,
    gloo_spike_ranks,
    report_text,
)

WINDOWS = ("fwd_bwd_start_bytes", "fwd_bwd_peak_bytes", "optimizer_start_bytes", "optimizer_peak_bytes")
CARD = {"n_layer": 4, "n_embd": 64, "n_head": 4, "n_kv_head": 2, "intermediate_size": 88, "vocab_size": 256, "block_size": 64}
BATCH, SEQ, SEED = 4, 32, 1
STRATEGIES = ("none", "full")
REPEATS = 3


def _layouts() -> dict:
    from pytest_flashckpt.config.layout import Layout, PipelineSchedule

    return ({"hsdp 2x2": Layout(dp_shard=2, dp_replicate=2), "pp 2 x hsdp 2x1": Layout(dp_shard=1, pp=2, dp_replicate=2)},
            PipelineSchedule("1f1b", 2))


LAYOUT_OF, PIPELINE = _layouts()


@contextlib.contextmanager
def fully_shard_over(module, hsdp_mesh):
    """While active, ``module``'s ``fully_shard`` (the builder's import of torch's) shards over ``hsdp_mesh`` instead
    of the mesh the builder passes: the builder's ``dp_shard`` dimension becomes the 2D HSDP mesh."""
    real = module.fully_shard

    def hsdp(target, *, mesh=None, **kwargs):  # noqa: ARG001 (the builder's 1D mesh, replaced)
        return real(target, mesh=hsdp_mesh, **kwargs)

    module.fully_shard = hsdp
    try:
        yield
    finally:
        module.fully_shard = real


def _readings(step, memory_step, parameter) -> dict:
    """A warm step (the optimizer state made), then the probed steps; and how a parameter is placed on the mesh
    (HSDP: replicated over ``dp_replicate``, sharded over ``dp_shard``)."""
    step()
    probed = [memory_step() for _ in range(REPEATS)]
    return {"windows": probed, "placements": str(tuple(parameter.placements)), "mesh": str(parameter.device_mesh.mesh_dim_names)}


def fsdp_layout(strategy: str, hsdp: bool) -> dict:
    from pytest_flashckpt.config.scenario import ActivationConfig
    from pytest_flashckpt.distributed import tensor_parallel as tp
    from pytest_flashckpt.models.cards import load_card

    layout = LAYOUT_OF["hsdp 2x2"]
    mesh = tp.make_mesh(layout)
    card = load_card("llama-tiny", **CARD)
    # the builder shards a mesh with dp_replicate as HSDP itself (tensor_parallel.fsdp_mesh); the FSDP reference is
    # forced onto dp_shard, and both split the batch over the 4 data-parallel ranks (tensor_parallel.data_rank)
    with contextlib.nullcontext() if hsdp else fully_shard_over(tp, mesh["dp_shard"]):
        trainer, _ = tp.build_trainer(card, layout, mesh, batch_size=BATCH, seq_len=SEQ, seed=SEED,
                                      activation=ActivationConfig(strategy))
    loss = float(tp.forward_backward(trainer).detach())
    trainer.optimizer.zero_grad(set_to_none=True)
    record = _readings(trainer.train_step, lambda: tp.memory_step(trainer), next(trainer.model.parameters()))
    return {**record, "loss": loss}


def pipeline_layout(strategy: str, hsdp: bool) -> dict:
    import torch

    from pytest_flashckpt.config.scenario import ActivationConfig
    from pytest_flashckpt.distributed import pipeline as pp
    from pytest_flashckpt.distributed.fsdp import mixed_precision_policy
    from pytest_flashckpt.models.cards import build_model, load_card

    layout = LAYOUT_OF["pp 2 x hsdp 2x1"]
    mesh = pp.make_mesh(layout)
    model = build_model(load_card("llama-tiny", **CARD), "sdpa", "cpu", torch.float32, seed=SEED)
    # the builder shards the stages over (dp_replicate, dp_shard) itself; the FSDP reference is forced onto dp_shard
    with contextlib.nullcontext() if hsdp else fully_shard_over(pp, mesh["dp_shard"]):
        trainer = pp.build_pipeline(model, layout, mesh, PIPELINE, batch_size=BATCH, seq_len=SEQ, seed=SEED,
                                    activation=ActivationConfig(strategy),
                                    mp_policy=mixed_precision_policy(torch.bfloat16))
    loss = trainer.forward_backward()
    trainer.optimizer.zero_grad(set_to_none=True)
    record = _readings(trainer.train_step, lambda: pp.memory_step(trainer), trainer.parameters()[0])
    return {**record, "loss": None if loss is None else float(loss)}


def hsdp_twin(name: str, strategy: str, rank: int) -> dict:
    """The HSDP rank ``rank`` of layout ``name`` simulated (``simulate.fake_ranks.simulate_rank``,
    ``simulate.pipeline``: the same builders under fake mode, warmed up by a real step as the gloo rank was)."""
    import torch

    from pytest_flashckpt.models.cards import load_card
    from pytest_flashckpt.simulate.fake_ranks import simulate_rank
    from pytest_flashckpt.simulate.pipeline import simulate_pipeline_rank

    card, layout = load_card("llama-tiny", **CARD), LAYOUT_OF[name]
    common = {"batch_size": BATCH, "seq_len": SEQ, "strategy": strategy, "rank": rank, "seed": SEED,
              "extrapolate": False, "warmup": "step"}
    if layout.pp == 1:
        return simulate_rank(card, layout, **common)
    return simulate_pipeline_rank(card, layout, PIPELINE, dtype=torch.bfloat16, precision="mixed", **common)


def simulate(ranks: list[dict]) -> None:
    """Each HSDP rank's simulated twin (``hsdp_twin``), added to its record."""
    add_twins((rank["layouts"][f"{name} | {strategy} | hsdp"], functools.partial(hsdp_twin, name, strategy, rank["rank"]))
              for name in LAYOUT_OF for strategy in STRATEGIES for rank in ranks)


def measured_and_simulated() -> list[dict]:
    ranks = measure()
    simulate(ranks)
    return ranks


LAYOUTS = {"hsdp 2x2": fsdp_layout, "pp 2 x hsdp 2x1": pipeline_layout}


def gloo_rank(out: Path) -> None:
    gloo_rank_records(out, "layouts", {f"{name} | {strategy} | {'hsdp' if hsdp else 'fsdp'}":
                                       functools.partial(run, strategy, hsdp)
                                       for name, run in LAYOUTS.items() for strategy in STRATEGIES
                                       for hsdp in (False, True)})


def measure() -> list[dict]:
    return gloo_spike_ranks(__file__, 4)


def render(ranks: list[dict], produced: str) -> str:
    lines = ["# Spike: HSDP ranks, alone and inside pipeline stages (issue 32)", "", produced, "",
             f"4 gloo ranks, a Llama card (`llama-tiny` with `{json.dumps(CARD)}`), batch {BATCH} x {SEQ} per replica. "
             "Each configuration built twice on the same ranks: `fsdp`, `fully_shard` over the `dp_shard` dimension "
             "only (each replica on its own: the FSDP rank of the shard group), and `hsdp`, over the 2D "
             "`(dp_replicate, dp_shard)` mesh (FSDP2's HSDP). Windows read by the rank probe after a warm step, "
             f"{REPEATS} repeats (min-max where they moved).", "",
             "| layout | strategy | rank | parameter placements fsdp / hsdp | fsdp: fwd+bwd start -> peak | hsdp: fwd+bwd "
             "start -> peak | fsdp: optimizer start -> peak | hsdp: optimizer start -> peak | hsdp - fsdp (peaks) | "
             "loss fsdp / hsdp | hsdp simulated: fwd+bwd, optimizer start -> peak | simulated - hsdp (lowest) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    equal, lowest, total, errors, twins, twins_equal = 0, 0, 0, [], 0, 0
    for name in LAYOUTS:
        for strategy in STRATEGIES:
            for rank in ranks:
                fsdp = rank["layouts"][f"{name} | {strategy} | fsdp"]
                hsdp = rank["layouts"][f"{name} | {strategy} | hsdp"]
                if "error" in fsdp or "error" in hsdp:
                    errors.append(f"- {name}, {strategy}, rank {rank['rank']}: `{fsdp.get('error') or hsdp.get('error')}`")
                    continue

                def window(r: dict, start: str, peak: str) -> str:
                    return f"{byte_range([w[start] for w in r['windows']])} -> {byte_range([w[peak] for w in r['windows']])}"

                same = all(a[k] == b[k] for a in fsdp["windows"] for b in hsdp["windows"] for k in WINDOWS)
                total += 1
                equal += same
                gaps = {k: min(b[k] for b in hsdp["windows"]) - min(a[k] for a in fsdp["windows"])
                        for k in ("fwd_bwd_peak_bytes", "optimizer_peak_bytes")}
                lowest += all(min(b[k] for b in hsdp["windows"]) == min(a[k] for a in fsdp["windows"]) for k in WINDOWS)
                loss = "" if fsdp["loss"] is None else f"{fsdp['loss']:.6f} / {hsdp['loss']:.6f}"
                sim = hsdp.get("simulated", {"error": "not simulated"})
                if "error" in sim:
                    errors.append(f"- {name}, {strategy}, rank {rank['rank']} (simulated): `{sim['error']}`")
                    simulated, twin = "error", "error"
                else:
                    low = {k: min(b[k] for b in hsdp["windows"]) for k in WINDOWS}
                    twins += 1
                    twins_equal += all(sim[k] == low[k] for k in WINDOWS)
                    simulated = (f"{sim['fwd_bwd_start_bytes']:,} -> {sim['fwd_bwd_peak_bytes']:,}, "
                                 f"{sim['optimizer_start_bytes']:,} -> {sim['optimizer_peak_bytes']:,}")
                    twin = "equal to the byte" if all(sim[k] == low[k] for k in WINDOWS) else ", ".join(
                        f"{k.replace('_bytes', '')} {sim[k] - low[k]:+,} B" for k in WINDOWS if sim[k] != low[k])
                lines.append(f"| {name} | {strategy} | {rank['rank']} | `{fsdp['mesh']}` {fsdp['placements']} / "
                             f"`{hsdp['mesh']}` {hsdp['placements']} | "
                             f"{window(fsdp, 'fwd_bwd_start_bytes', 'fwd_bwd_peak_bytes')} | "
                             f"{window(hsdp, 'fwd_bwd_start_bytes', 'fwd_bwd_peak_bytes')} | "
                             f"{window(fsdp, 'optimizer_start_bytes', 'optimizer_peak_bytes')} | "
                             f"{window(hsdp, 'optimizer_start_bytes', 'optimizer_peak_bytes')} | "
                             f"{'equal to the byte' if same else ', '.join(f'{v:+,} B' for v in gaps.values())} | {loss} | "
                             f"{simulated} | {twin} |")
    lines += ["", "## What it says", "",
              f"In {equal} of {total} rank x layout x strategy cases every window of the HSDP rank (start and peak, "
              "forward+backward and optimizer, every repeat) equals the FSDP rank of its shard group to the byte; "
              f"at each window's lowest of the {REPEATS} repeats, in {lowest} of {total} (a repeat above it: gloo's "
              "thread holding a finished collective a moment longer).", "",
              f"The HSDP rank simulated by the real engine under fake mode (the same builder, a real warm step): every "
              f"window equal to the measured HSDP rank's lowest repeat to the byte in {twins_equal} of {twins} cases."]
    return report_text(lines, errors)


def main() -> None:
    gloo_spike_main(__doc__, __file__, gloo_rank, measured_and_simulated, render)


if __name__ == "__main__":
    main()
