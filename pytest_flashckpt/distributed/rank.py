"""One rank of a distributed scenario: ``python -m pytest_flashckpt.distributed.rank --scenario S.json --out DIR``,
started by torchrun (``launcher``). The model is FSDP2-sharded over every rank, or laid out as the scenario's
``layout`` says (``dp_shard x tp``: tensor + sequence parallel by ``parallelize_module`` on a 2D ``DeviceMesh``,
then FSDP2 over its dp_shard dimension; ``distributed.tensor_parallel``; ``pp`` pipeline stages run by torch's
schedule, ``distributed.pipeline``; docs/layouts.md). Writes
``DIR/rank-<r>.json`` with this rank's measurements:

- ``peak_bytes`` / ``state_bytes``: the memory probe around one training step (what this rank holds: local shards
  of the DTensor parameters, gradients and AdamW state, all-gathered parameters while they live, reduce-scatter
  buffers and activations; the rank probe ``distributed.memory`` counts live tensor bytes exactly, FSDP2's in-place
  frees included), split into ``fwd_bwd_peak_bytes`` (where activation strategies act) and
  ``optimizer_peak_bytes``; ``largest_allgather_bytes`` bounds what gloo's staging adds on a CPU rank
  (``GLOO_STAGING_FACTOR`` x it, not counted);
- ``step_time_s``: every timed step (ranks enter each round together, after a barrier);
- ``saves``: per save this rank's ``save_stall_s`` (training blocked), ``save_total_s`` (until committed),
  ``bytes_written`` (the shard files it wrote), ``async_staged_bytes`` (the host copy an async save stages: this
  rank's state) and ``async_rss_added_bytes`` (resident memory measured around the staging; the allocator may reuse
  freed pages): the names of the metric vocabulary (``core.metrics``) they become, checked before they are written;
- ``roundtrip_differences``: rank 0, after the last save: tensors of the state loaded back into a fresh sharded
  trainer that differ in any bit from the gathered original (0 for a correct save).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from pytest_flashckpt import compile_step
from pytest_flashckpt.activation import StrategyUnavailable
from pytest_flashckpt.config.scenario import Scenario
from pytest_flashckpt.config.typed import build
from pytest_flashckpt.core.metrics import spec as metric_spec
from pytest_flashckpt.distributed import context_parallel, fsdp, pipeline, sharded_store, tensor_parallel
from pytest_flashckpt.distributed.memory import CompiledShardedProbe, ShardedLiveTensorProbe
from pytest_flashckpt.models.attention import OpNameRecorder, detect_kernel, resolve_backend
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.models.hf.card import hf_card
from pytest_flashckpt.probes import make_probe
from pytest_flashckpt.probes.compiled import inductor_buffers_dispatched

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _card(scenario: Scenario):
    spec = scenario.model
    if spec.hf is not None:  # a Hugging Face config: the builder a one-process run uses (models.hf)
        return hf_card(spec.hf, spec.dropout, spec.anatomy)
    return load_card(scenario.card, **({} if spec.dropout is None else {"dropout": spec.dropout}))


def _trainer(scenario: Scenario, device: torch.device, backend: str, mesh=None, before_shard=None):
    """The rank's trainer: FSDP2 over every rank, or (``mesh``: a tensor-parallel, context-parallel or HSDP layout's
    ``DeviceMesh``) ``parallelize_module`` then FSDP2 over the mesh's dp_shard (x cp) ranks, replicated over
    dp_replicate (``distributed.tensor_parallel``)."""
    card = _card(scenario)
    if mesh is not None:
        return tensor_parallel.build_trainer(
            card, scenario.parallel_layout, mesh, batch_size=scenario.batch_size, seq_len=scenario.seq_len, seed=scenario.seed,
            backend=backend, device=device, dtype=DTYPES[scenario.dtype], activation=scenario.activation,
            precision=scenario.precision, before_shard=before_shard,
        )  # fmt: skip
    return fsdp.build_trainer(
        card, batch_size=scenario.batch_size, seq_len=scenario.seq_len, seed=scenario.seed, backend=backend,
        device=device, dtype=DTYPES[scenario.dtype], activation=scenario.activation, precision=scenario.precision,
        before_shard=before_shard,
    )  # fmt: skip


def _local(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.to_local() if isinstance(t, DTensor) else t for t in tensors]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _probe(name: str, device: torch.device):
    return ShardedLiveTensorProbe(device.type) if name == "cpu" else make_probe(name, device)


def _memory_step(trainer, probe_name: str, device: torch.device) -> dict[str, int]:
    """One training step measured in two parts: forward + backward (where activation strategies act) and the
    optimizer step (AdamW on the DTensor shards, whose temporaries can set the step's peak)."""
    trainer.model.train()
    x, y = trainer.batch()
    loss_context = getattr(trainer, "loss_context", contextlib.nullcontext)  # loss_parallel under tensor parallel
    with _probe(probe_name, device).track(resident=_local(trainer.state_tensors())) as fwd_bwd, loss_context():
        trainer.loss(x, y).backward()  # the model's loss (a context-parallel rank's with its tokens' positions)
    _sync(device)
    grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
    with _probe(probe_name, device).track(resident=_local(trainer.state_tensors() + grads)) as opt:
        trainer.optimizer.step()
        trainer.scheduler.step()
        trainer.optimizer.zero_grad(set_to_none=True)
    _sync(device)
    trainer.step += 1
    return {
        "peak_bytes": max(fwd_bwd.peak_bytes, opt.peak_bytes),
        "fwd_bwd_peak_bytes": fwd_bwd.peak_bytes,
        "optimizer_peak_bytes": opt.peak_bytes,
        "state_bytes": fwd_bwd.start_bytes,
        "fwd_bwd_start_bytes": fwd_bwd.start_bytes,
        "optimizer_start_bytes": opt.start_bytes,
        # gloo's staging of an in-flight all-gather is not counted (see distributed.memory); this bounds it
        "largest_allgather_bytes": int(fwd_bwd.extra.get("largest_allgather_bytes", 0)),
    }


def measure(scenario: Scenario, device: torch.device, probe_name: str, ckpt_root: Path) -> dict[str, Any]:
    rank = dist.get_rank()
    out: dict[str, Any] = {"rank": rank, "world_size": dist.get_world_size(), "status": "measured"}
    backend = resolve_backend(scenario.attention, device, DTYPES[scenario.dtype])
    layout = scenario.parallel_layout
    if layout.cp > 1:  # torch's ring attention runs the device's explicit flash op (distributed.context_parallel)
        backend = context_parallel.ring_backend(device.type)
    if layout.pp > 1:  # eager or compiled stages
        return _measure_pipeline(scenario, device, backend, probe_name, ckpt_root, out)
    laid_out = layout.tp > 1 or layout.cp > 1 or layout.dp_replicate > 1  # else FSDP over every rank
    mesh = tensor_parallel.make_mesh(layout, device.type) if laid_out else None
    if scenario.compile.enabled:
        return _measure_compiled(scenario, device, backend, mesh, out)
    trainer, applied = _trainer(scenario, device, backend, mesh)
    out.update(backend=backend, activation=applied.describe(), layout=layout.describe())
    out["kernel"] = _warm_up(trainer, scenario, backend)

    if "memory" in scenario.measure:
        out.update(_memory_step(trainer, probe_name, device))

    if "timing" in scenario.measure:
        out["step_time_s"] = _timed_rounds(trainer, scenario, device)

    if scenario.save.strategy == "dcp":
        _save_and_load_back(scenario, trainer, lambda: _trainer(scenario, device, backend, mesh)[0], ckpt_root, out)
    return out


def _warm_up(trainer, scenario: Scenario, backend: str) -> str:
    """The scenario's warm-up steps (at least one), the first watched for the attention kernel it ran."""
    with OpNameRecorder() as recorder:
        trainer.train_step()
    for _ in range(max(scenario.warmup, 1) - 1):
        trainer.train_step()
    return detect_kernel(recorder.op_names, backend)


def _save_and_load_back(scenario: Scenario, trainer, fresh_trainer, ckpt_root: Path, out: dict[str, Any],
                        per_rank: bool = False) -> None:
    """The scenario's sharded saves (every ``save_interval`` steps), then the last one loaded into a fresh trainer
    of the layout and compared bit for bit: gathered on rank 0 (``sharded_store.gathered_state``), or (``per_rank``:
    pipeline stages, each rank holding its own parameters) each rank's own full state, the differences summed."""
    save = scenario.save
    config = {"scenario": scenario.name, "card": scenario.card, "async_save": save.async_save}
    with sharded_store.ShardedCheckpointer(ckpt_root, async_save=save.async_save, config=config) as ckpt:
        for _ in range(save.saves):
            for _ in range(save.save_interval):
                trainer.train_step()
            ckpt.save(trainer)
    out["saves"] = [_save_record(r) for r in ckpt.saves]
    state_of = sharded_store.local_full_state if per_rank else sharded_store.gathered_state
    original = state_of(trainer)  # the trainer has not moved since the last save
    fresh = fresh_trainer()
    start = time.perf_counter()
    sharded_store.load(fresh, sharded_store.latest(ckpt_root))
    out["load_s"] = time.perf_counter() - start
    counts = torch.tensor([len(sharded_store.bitwise_differences(state_of(fresh), original)), len(original)])
    if per_rank:
        dist.all_reduce(counts)
    if dist.get_rank() == 0:
        out["roundtrip_differences"], out["roundtrip_tensors"] = int(counts[0]), int(counts[1])


def build_stages(scenario: Scenario, device: torch.device, backend: str, mesh,
                 before_shard=None) -> pipeline.PipelineTrainer:
    """This rank's pipeline stages of ``scenario`` on ``mesh`` (``pipeline.make_mesh``), ``before_shard`` (a
    compiled scenario's block compile) called on each stage's part before ``fully_shard``."""
    mixed = scenario.precision == "mixed"
    dtype = DTYPES[scenario.dtype]  # (a layout's model is a card's: config.scenario refuses model.hf)
    model = build_model(_card(scenario), backend, device, torch.float32 if mixed else dtype, seed=scenario.seed)
    return pipeline.build_pipeline(
        model, scenario.parallel_layout, mesh, scenario.layout.pipeline_schedule(), batch_size=scenario.batch_size,
        seq_len=scenario.seq_len, seed=scenario.seed, activation=scenario.activation,
        mp_policy=fsdp.mixed_precision_policy(dtype) if mixed else None, device=device, before_shard=before_shard,
    )  # fmt: skip


def _measure_pipeline(scenario: Scenario, device: torch.device, backend: str, probe_name: str, ckpt_root: Path,
                      out: dict[str, Any]) -> dict[str, Any]:
    """A rank of pipeline stages (``distributed.pipeline``: the model built whole, split into stages, TP and FSDP2
    inside them, run by torch's schedule over the layout's microbatches): warmed up, one step in the rank's two
    windows (``pipeline.memory_step``, the rank probe; the stages' receive buffers count from the start), timed
    rounds, then the scenario's sharded saves of the stages (one checkpoint under the whole model's names) loaded
    back into fresh stages bit for bit. Ranks of different pipeline stages hold different bytes: each rank's record
    keeps its stages."""
    if "memory" in scenario.measure and probe_name != "cpu":
        raise StrategyUnavailable(f"pipeline stages under the {probe_name} probe: a stage's two windows are counted by "
                                  "the rank probe (cpu) only; the device probes are not wired yet (issue 32 item 8)")
    layout, schedule = scenario.parallel_layout, scenario.layout.pipeline_schedule()
    stages = functools.partial(build_stages, scenario, device, backend, pipeline.make_mesh(layout, device.type))
    if scenario.compile.enabled:
        return _measure_compiled_stages(scenario, device, backend, stages, out)
    trainer = stages()
    out.update(backend=backend, activation=trainer.activation, layout=f"{layout.describe()}, {schedule.describe()}")
    out["kernel"] = _warm_up(trainer, scenario, backend)
    if "memory" in scenario.measure:
        record = pipeline.memory_step(trainer, device.type)
        out.update(record, state_bytes=record["fwd_bwd_start_bytes"])
    if "timing" in scenario.measure:
        out["step_time_s"] = _timed_rounds(trainer, scenario, device)
    if scenario.save.strategy == "dcp":  # the stages under the whole model's names (PipelineTrainer.model)
        _save_and_load_back(scenario, trainer, stages, ckpt_root, out, per_rank=True)
    return out


def _measure_compiled_stages(scenario: Scenario, device: torch.device, backend: str, stages, out: dict[str, Any]) -> dict[str, Any]:
    """A rank of compiled pipeline stages (reports/spike-compiled-stages.md): every block of each stage compiled
    after the activation strategy and before ``fully_shard`` (``build_pipeline``'s ``before_shard``), measured as
    ``_compiled_rank`` measures a compiled rank; each block's region runs once per microbatch (twice with the
    checkpoint outside), and the rank's state counts its stages' receive buffers, as the eager stage's does; tensor
    parallel inside the stages as reports/spike-compiled-tp-stages.md measured it."""
    schedule = scenario.layout.pipeline_schedule()

    def build(compile_blocks):
        trainer = stages(compile_blocks)
        return trainer, trainer.activation

    return _compiled_rank(
        scenario, device, backend, out, build, layout=f"{scenario.parallel_layout.describe()}, {schedule.describe()}",
        runs_per_step=schedule.microbatches,
        resident=lambda trainer: _local(trainer.state_tensors()) + pipeline.communication_buffers(trainer),
        windows=lambda trainer: pipeline.memory_step(trainer, device.type, probe_class=CompiledShardedProbe))


def _timed_rounds(trainer, scenario: Scenario, device: torch.device) -> list[float]:
    """Seconds per step of every timing round; the ranks enter each round together (a barrier)."""
    times = []
    for _ in range(scenario.rounds):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(scenario.steps):
            trainer.train_step()
        _sync(device)
        times.append((time.perf_counter() - start) / scenario.steps)
    return times


def _measure_compiled(scenario: Scenario, device: torch.device, backend: str, mesh, out: dict[str, Any]) -> dict[str, Any]:
    """A compiled rank of FSDP2 over every rank, or (``mesh``) tensor parallel then FSDP2 over its dp_shard
    dimension (``config.axes.CompileConfig`` refuses what does not compile), measured by ``_compiled_rank``."""
    def build(compile_blocks):
        trainer, applied = _trainer(scenario, device, backend, mesh, compile_blocks)
        return trainer, applied.describe()

    return _compiled_rank(
        scenario, device, backend, out, build,
        layout=scenario.parallel_layout.describe(), runs_per_step=1,
        resident=lambda trainer: _local(trainer.state_tensors()),
        windows=lambda trainer: tensor_parallel.memory_step(trainer, probe_class=CompiledShardedProbe))


def _compiled_rank(scenario: Scenario, device: torch.device, backend: str, out: dict[str, Any], build, *, layout: str,
                   runs_per_step: int, resident, windows) -> dict[str, Any]:
    """A compiled rank: ``build(compile_blocks)`` lays the rank out with ``compile_blocks`` called on each model part
    after the activation strategy and before ``fully_shard`` (torchtitan's order; under tensor parallel the
    embedding's output is waited for in eager first, ``tensor_parallel.settle_embedding_output``, a no-op on a
    pipeline stage that receives hidden states) and returns (trainer, what the strategy applied); the rank is warmed up and checked as one process checks it (``compile_step.warmed_up``: a
    graph compiled, no break, every block's region ran, ``runs_per_step`` times a step), its peak read from one
    step's allocator events over its ``resident(trainer)`` tensors (the ``cpu`` probe is a dispatch mode: Dynamo
    would run the step eager; ``runner.compiled``), the next step's two ``windows(trainer)`` by the rank probe made
    to run under compiled code (``memory.CompiledShardedProbe``, what the simulated rank is compared with), times as
    an eager rank's, graphs compiled after the warm-up counted."""
    reason = compile_step.compiler_missing()
    if reason is not None:
        raise StrategyUnavailable(reason)
    torch._dynamo.reset()
    regions: list[int] = []
    compile_backend = compile_step.budget_backend(scenario.activation.budget) if scenario.activation.strategy == "compile_budget" else None  # type: ignore[arg-type]

    def compile_blocks(model: torch.nn.Module) -> None:
        if scenario.layout.tensor_parallel:
            tensor_parallel.settle_embedding_output(model)
        regions.append(compile_step.compile_model(model, scenario.compile, compile_backend))

    # FSDP alone: Inductor's output views (compile_step); every buffer seen by the rank probe (probes.compiled)
    with compile_step.fsdp_compiled_block_outputs(), inductor_buffers_dispatched():
        trainer, activation = build(compile_blocks)
        out.update(backend=backend, activation=activation, layout=layout, kernel=_eager_kernel(scenario, device, backend))
        side = compile_step.warmed_up(trainer, scenario, sum(regions) * runs_per_step, scenario.warmup)
        out.update(compile_time_s=side.compile_time_s, compiled_regions=side.regions_per_step)
        graphs_after_warmup = compile_step.dynamo_counts()[0]
        if "memory" in scenario.measure:
            if device.type != "cpu":
                raise StrategyUnavailable("a compiled rank's peak is read from the CPU allocator's events; on a GPU rank "
                                          "the allocator probe is not wired yet (issue 32 item 8)")
            start = _storage_bytes(resident(trainer))
            reading = compile_step.check_regions(side, compile_step.read_step(trainer.train_step), scenario.name)
            out.update(peak_bytes=start + reading.added_peak_bytes, state_bytes=start, peak_source="allocator")
            # and the next step's two windows by the rank probe run under compiled code (what the simulated rank,
            # simulate.fake_ranks / simulate.pipeline, is compared with)
            counted = windows(trainer)
            out.update({k: counted[k] for k in ("fwd_bwd_peak_bytes", "optimizer_peak_bytes", "largest_allgather_bytes")})
        if "timing" in scenario.measure:
            out["step_time_s"] = _timed_rounds(trainer, scenario, device)
    out["recompiles"] = compile_step.dynamo_counts()[0] - graphs_after_warmup
    return out


def _storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the storages under ``tensors``, each once (a DTensor as its local shard)."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def _eager_kernel(scenario: Scenario, device: torch.device, backend: str) -> str:
    """The attention kernel an eager forward of the scenario's card runs (a compiled step cannot be watched by a
    dispatch mode): one forward of the plain model on one batch row, no process group involved."""
    if scenario.model.hf is not None:
        return backend  # a Hugging Face model's eager twin is not built here: the backend asked for
    model = build_model(load_card(scenario.card), backend, device, DTYPES[scenario.dtype], seed=scenario.seed)
    x = torch.zeros(1, scenario.seq_len, dtype=torch.long, device=device)
    with OpNameRecorder() as recorder, torch.no_grad():
        model(x, x)
    return detect_kernel(recorder.op_names, backend)


def _save_record(save: Any) -> dict[str, Any]:
    """One sharded save of this rank, under the vocabulary's names (``aggregate`` reads them as they are)."""
    record = {"save_stall_s": save.stall_s, "save_total_s": save.total_s, "bytes_written": save.bytes_written,
              "async_staged_bytes": save.staged_bytes, "async_rss_added_bytes": save.host_bytes_added}
    for name in record:
        metric_spec(name)  # UnknownMetric here, in the rank, rather than a KeyError when the records are gathered
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="one rank of a distributed flashckpt scenario (started by torchrun)")
    parser.add_argument("--scenario", type=Path, required=True, help="the scenario as JSON (config.typed.to_plain)")
    parser.add_argument("--out", type=Path, required=True, help="folder for rank-<r>.json")
    parser.add_argument("--checkpoints", type=Path, required=True, help="checkpoint folder (shared by every rank)")
    parser.add_argument("--probe", default="cpu")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds any collective may wait for a peer")
    args = parser.parse_args(argv)
    scenario = build(Scenario, json.loads(args.scenario.read_text(encoding="utf-8")), str(args.scenario))
    device = fsdp.init(timeout_s=args.timeout)
    rank = dist.get_rank()
    try:
        result = measure(scenario, device, args.probe, args.checkpoints)
    except StrategyUnavailable as exc:
        result = {"rank": rank, "status": "skipped", "reason": exc.reason}
    except Exception as exc:
        result = {"rank": rank, "status": "error", "reason": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        (args.out / f"rank-{rank}.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
        raise  # torchrun ends the other ranks
    (args.out / f"rank-{rank}.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
