"""Spike for issue 32 (parallel layouts): does torch's real ``fully_shard`` / ``parallelize_module`` / pipeline
split run in ONE process under ``FakeTensorMode`` with the fake process group (``init_process_group("fake")``:
collectives do nothing, every rank's shapes are real), how long does it take, and is the rank's live tensor bytes
what a real gloo rank holds?

    python benchmarks/spike_fake_layouts.py                  # every case, writes reports/spike-fake-layouts.md
    python benchmarks/spike_fake_layouts.py --only A B        # those cases, prints the tables (writes nothing)
    python benchmarks/spike_fake_layouts.py --case tp2-llama  # one case, prints its JSON (what the driver runs)

The report's measured part is rewritten by a full run; what follows its ``FINDINGS`` marker (the written-up
findings and the recommendation) is kept.

Every case runs in its own interpreter (a fresh process group and fake mode each; an abort or hang costs that case
only) with a timeout. A case builds the project's model (``models.cards.build_model``) under ``FakeTensorMode``,
applies the layout, runs one warm step (AdamW state exists after it), then one measured step in two windows
(forward + backward, then optimizer step + zero_grad), counted by the rank probe the distributed runner uses
(``distributed.memory.ShardedLiveTensorProbe``: DTensors as their local shards, FSDP2's in-place frees seen).
The gloo cases (``gloo-*``) run the same code on real CPU ranks (torchrun, ``distributed.launcher``) without fake
mode, so simulated and measured numbers come from one function.

Layouts: ``fsdp`` (``fully_shard`` per block and root); ``tp`` (Colwise/Rowwise on the projections,
SequenceParallel on the norms, Rowwise embedding to sequence shards, Colwise head back to replicated logits, the
torchtitan Llama plan without loss parallel); ``2d`` (dp x tp DeviceMesh: that TP plan on "tp", ``fully_shard``
on "dp"); ``pp`` (two ``PipelineStage``s of the Llama, GPipe over 2 micro-batches, the case measures one stage);
``cp`` (``context_parallel`` over SDPA). The project's Llama attention views q/k/v with the global head count and
reshapes with the input's width, which a column-sharded projection does not have, so the tp/2d cases swap in a
forward that reads both from the projected tensor (``_tp_attention_forward``, same math); the GPT (fused qkv) is
tried unchanged, so its error is torch's answer for the model as written.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "reports" / "spike-fake-layouts.md"
BATCH, SEQ = 4, 128  # small cards: every case (fake and gloo) runs this global batch

# name -> (layout, card, world, extra); the gloo twin of a fake case has the same layout, card and world
CASES = {
    "fsdp4-gpt": ("fsdp", "tiny", 4, {}),
    "fsdp8-gpt": ("fsdp", "tiny", 8, {"batch": 8}),
    "fsdp4-llama": ("fsdp", "llama-tiny", 4, {}),
    "fsdp8-llama": ("fsdp", "llama-tiny", 8, {"batch": 8}),
    "tp2-gpt": ("tp", "tiny", 2, {}),
    "tp2-llama": ("tp", "llama-tiny", 2, {}),
    "2d-llama": ("2d", "llama-tiny", 4, {}),
    "pp2-llama-stage0": ("pp", "llama-tiny", 2, {"rank": 0}),
    "pp2-llama-stage1": ("pp", "llama-tiny", 2, {"rank": 1}),
    "cp2-llama-cpu": ("cp", "llama-tiny", 2, {}),
    "cp2-llama-cuda-flash": ("cp", "llama-tiny", 2, {"device": "cuda"}),
    "fsdp8-llama70b-1block": ("fsdp", "llama3-70b", 8, {"batch": 8, "seq": 8192, "n_layer": 1, "dtype": "bfloat16",
                                                         "strategy": "full"}),
    "fsdp8-llama70b-4block": ("fsdp", "llama3-70b", 8, {"batch": 8, "seq": 8192, "n_layer": 4, "dtype": "bfloat16",
                                                         "strategy": "full"}),
    "fsdp8-llama70b-16block": ("fsdp", "llama3-70b", 8, {"batch": 8, "seq": 8192, "n_layer": 16, "dtype": "bfloat16",
                                                           "strategy": "full"}),
    "fsdp8-llama70b": ("fsdp", "llama3-70b", 8, {"batch": 8, "seq": 8192, "dtype": "bfloat16", "strategy": "full"}),
}
GLOO = {"gloo-tp2-llama": "tp2-llama", "gloo-fsdp4-gpt": "fsdp4-gpt", "gloo-fsdp4-llama": "fsdp4-llama"}
FINDINGS = "<!-- findings: kept when the measured part above is regenerated -->"
RAW = "## Raw records"
TIMEOUT_S = {"fsdp8-llama70b": 420, "fsdp8-llama70b-16block": 420}


def _tp_attention_forward(self, x, cos, sin):
    """The Llama attention with head counts and width read off the (possibly column-sharded) projections."""
    from pytest_flashckpt.models.attention import causal_attention
    from pytest_flashckpt.models.llama.model import _rotate

    q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
    B, T, _ = q.shape
    q = q.view(B, T, -1, self.head_dim).transpose(1, 2)
    k = k.view(B, T, -1, self.head_dim).transpose(1, 2)
    v = v.view(B, T, -1, self.head_dim).transpose(1, 2)
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    y = causal_attention(q, k, v, self.backend, 0.0)
    return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


def _tp_plan(model) -> tuple[dict, dict]:
    """(root plan, block plan) for the project's GPT or Llama (module names differ)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    rows_out = lambda: RowwiseParallel(output_layouts=Shard(1))  # noqa: E731  reduce-scatter to sequence shards

    def gather(n_args: int) -> PrepareModuleInput:  # all-gather the sequence shards on the 3-D tensor (torchtitan)
        return PrepareModuleInput(input_layouts=(Shard(1),) + (None,) * (n_args - 1),
                                  desired_input_layouts=(Replicate(),) + (None,) * (n_args - 1))

    if hasattr(model, "embed_tokens"):
        root = {"embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
                "norm": SequenceParallel(),
                "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())}
        block = {"input_layernorm": SequenceParallel(), "post_attention_layernorm": SequenceParallel(),
                 "self_attn": gather(3), "mlp": gather(1),
                 "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
                 "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": rows_out(),
                 "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": rows_out()}
    else:
        root = {"wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
                "ln_f": SequenceParallel(),
                "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())}
        block = {"ln_1": SequenceParallel(), "ln_2": SequenceParallel(), "attn": gather(1), "mlp": gather(1),
                 "attn.c_attn": ColwiseParallel(),
                 "attn.c_proj": rows_out(), "mlp.c_fc": ColwiseParallel(), "mlp.c_proj": rows_out()}
    return root, block


def _apply_tp(model, mesh) -> None:
    import types

    from torch.distributed.tensor.parallel import parallelize_module

    root, block_plan = _tp_plan(model)
    parallelize_module(model, mesh, root)
    for block in model.blocks:
        parallelize_module(block, mesh, block_plan)
        if hasattr(block, "self_attn"):
            block.self_attn.forward = types.MethodType(_tp_attention_forward, block.self_attn)


class _Stage(__import__("torch").nn.Module):
    """One pipeline stage of the project's Llama: blocks ``lo:hi``, the embedding on the first, norm + head on the
    last (rotary tables recomputed per stage from the sequence length, as the full model does)."""

    def __init__(self, model, lo: int, hi: int) -> None:
        super().__init__()
        self.config, self.first, self.last = model.config, lo == 0, hi == len(model.blocks)
        self.embed_tokens = model.embed_tokens if self.first else None
        self.blocks = model.blocks[lo:hi]
        self.norm, self.lm_head = (model.norm, model.lm_head) if self.last else (None, None)

    def forward(self, x):
        from pytest_flashckpt.models.llama.model import rotary_tables

        if self.first:
            x = self.embed_tokens(x)
        cos, sin = rotary_tables(x.shape[1], self.config.head_dim, self.config.rope_theta, x.device, x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.lm_head(self.norm(x)) if self.last else x


def _real_mesh_tensors() -> None:
    """FSDP2 on a TP-sharded parameter concatenates the dp and tp meshes (``DeviceMesh._concatenate``) while the
    model is laid out, so under FakeTensorMode the new mesh's rank tensor is fake and its coordinates cannot be read
    (``DynamicOutputShapeException: aten.nonzero``). Mesh tensors are a few ints: make them real."""
    import functools

    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    init = DeviceMesh.__init__

    @functools.wraps(init)
    def real_init(self, *args, **kwargs):
        with unset_fake_temporarily():
            init(self, *args, **kwargs)

    DeviceMesh.__init__ = real_init


def _static_pipeline() -> None:
    """``torch.distributed.pipelining``'s first step votes over P2P on static or dynamic shape inference, reads the
    vote with ``.item()`` (data-dependent under FakeTensorMode: ``aten._local_scalar_dense``), and a dynamic vote
    then receives the peer's pickled metadata (``recv_object_list``), which no fake peer sends. Every stage here is
    given its input and output shapes, which is what the static mode needs: skip the vote and take static."""
    from torch.distributed.pipelining import schedules
    from torch.distributed.pipelining.stage import InferenceMode

    def static(self, stages, *_args, **_kwargs):
        for stage in stages:
            stage._inference_mode = InferenceMode.STATIC

    for cls in vars(schedules).values():
        if isinstance(cls, type) and "_warmup_p2p" in vars(cls):
            cls._warmup_p2p = static


def _build(card, device: str, dtype):
    """``models.cards.build_model`` without its final ``model.to(dtype)`` (under FakeTensorMode ``Module._apply``
    cannot swap a fake parameter: "Couldn't swap Embedding.weight") and without its CPU size guard (nothing is
    allocated under fake mode): the parameters are created in ``dtype`` instead, from the same seed."""
    import torch

    from pytest_flashckpt.models.families import family_of

    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            with torch.device(device):
                return family_of(card).build(card, "sdpa")
    finally:
        torch.set_default_dtype(default)


def _measure(fwd_bwd, optimizer, state, grads) -> dict:
    """The two windows of ``distributed.rank._memory_step``: forward + backward, then the optimizer step."""
    from pytest_flashckpt.distributed.memory import ShardedLiveTensorProbe
    from pytest_flashckpt.distributed.rank import _local

    timings = {}
    started = time.perf_counter()
    with ShardedLiveTensorProbe("cpu").track(resident=_local(state())) as fb:
        fwd_bwd()
    timings["fwd_bwd_s"] = time.perf_counter() - started
    started = time.perf_counter()
    with ShardedLiveTensorProbe("cpu").track(resident=_local(state() + grads())) as opt:
        optimizer()
    timings["optimizer_s"] = time.perf_counter() - started
    return {"fwd_bwd_start_bytes": fb.start_bytes, "fwd_bwd_peak_bytes": fb.peak_bytes,
            "optimizer_start_bytes": opt.start_bytes, "optimizer_peak_bytes": opt.peak_bytes,
            "peak_bytes": max(fb.peak_bytes, opt.peak_bytes), **timings}


def run_case(layout: str, card_name: str, world: int, extra: dict, fake: bool) -> dict:
    """Build, lay out, warm and measure one rank of one case (the fake process group's rank ``extra['rank']``)."""
    import contextlib

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from pytest_flashckpt.activation import apply_ac
    from pytest_flashckpt.config.scenario import ActivationConfig
    from pytest_flashckpt.distributed import fsdp
    from pytest_flashckpt.models.cards import build_model, load_card

    out: dict = {}
    t0 = time.perf_counter()
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=extra.get("rank", 0), world_size=world)
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        if layout == "pp":
            _static_pipeline()
            out["workaround"] = "static shape inference forced (the schedule's P2P vote reads .item(); no fake peer sends metadata)"
        if layout == "2d":
            _real_mesh_tensors()
            out["workaround"] = "DeviceMesh.__init__ outside fake mode (FSDP2 concatenates the dp and tp meshes)"
    else:
        fsdp.init(timeout_s=300)
        mode = contextlib.nullcontext()
    rank = dist.get_rank()
    batch, seq = extra.get("batch", BATCH), extra.get("seq", SEQ)
    dtype = getattr(torch, extra.get("dtype", "float32"))
    overrides = {"n_layer": extra["n_layer"]} if "n_layer" in extra else {}
    card = load_card(card_name, **overrides)
    device = extra.get("device", "cpu")
    # meshes outside fake mode (as torchtitan's estimate builds them): DeviceMesh reads its rank tensor's values
    if layout == "2d":
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    elif layout in ("fsdp", "tp"):
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=(layout,))
    elif layout == "cp":
        mesh = init_device_mesh(device, (world,), mesh_dim_names=("cp",))
    with mode:
        model = _build(card, device, dtype) if fake else build_model(card, "sdpa", device, dtype, seed=0)
        trainer_rank, trainer_world = rank, world
        if layout == "fsdp":
            apply_ac(model, ActivationConfig(strategy=extra.get("strategy", "none")))
            for block in model.blocks:  # what distributed.fsdp.shard does, on the mesh made above
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
        elif layout == "tp":
            _apply_tp(model, mesh)
            trainer_rank, trainer_world = 0, 1  # every TP rank reads the whole batch
        elif layout == "2d":
            _apply_tp(model, mesh["tp"])
            for block in model.blocks:
                fully_shard(block, mesh=mesh["dp"])
            fully_shard(model, mesh=mesh["dp"])
            trainer_rank, trainer_world = mesh["dp"].get_local_rank(), world // 2
        out["layout_s"] = time.perf_counter() - t0
        if layout == "pp":
            out.update(_run_pp(model, rank, world, batch, seq, device))
        elif layout == "cp":
            out.update(_run_cp(model, mesh, batch, seq, device))
        else:
            trainer = fsdp.ShardedTrainer.create(model, batch, seq, seed=0)
            trainer.rank, trainer.world_size = trainer_rank, trainer_world
            started = time.perf_counter()
            trainer.train_step()
            out["warm_step_s"] = time.perf_counter() - started
            x, y = trainer.batch()
            params = list(model.parameters())

            def optimizer_step() -> None:
                trainer.optimizer.step()
                trainer.scheduler.step()
                trainer.optimizer.zero_grad(set_to_none=True)

            out.update(_measure(lambda: model(x, y).backward(), optimizer_step, trainer.state_tensors,
                                lambda: [p.grad for p in params if p.grad is not None]))
            local = [p.to_local() if hasattr(p, "to_local") else p for p in params]
            out["local_param_bytes"] = sum(t.numel() * t.element_size() for t in local)
    out["total_s"] = time.perf_counter() - t0
    out["rank"] = rank
    dist.destroy_process_group()
    return out


def _run_pp(model, rank: int, world: int, batch: int, seq: int, device: str) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    n = len(model.blocks)
    bounds = [(i * n // world, (i + 1) * n // world) for i in range(world)]
    stage_module = _Stage(model, *bounds[rank])
    micro = 2
    mb, width = batch // micro, model.config.n_embd
    dtype = next(model.parameters()).dtype
    inp = torch.zeros(mb, seq, dtype=torch.long, device=device) if rank == 0 else torch.zeros(mb, seq, width, dtype=dtype, device=device)
    last = rank == world - 1
    out_arg = torch.zeros(mb, seq, model.config.vocab_size, dtype=dtype, device=device) if last else torch.zeros(mb, seq, width, dtype=dtype, device=device)
    grads = {} if last else {"output_grads": (torch.zeros_like(out_arg),)}  # static mode: what the next stage sends
    stage = PipelineStage(stage_module, rank, world, torch.device(device), input_args=(inp,), output_args=(out_arg,),
                          **grads)

    def loss_fn(logits, targets):
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

    schedule = ScheduleGPipe(stage, n_microbatches=micro, loss_fn=loss_fn)
    optimizer = torch.optim.AdamW(stage_module.parameters(), lr=3e-4)
    x = torch.randint(0, model.config.vocab_size, (batch, seq), device=device)
    y = torch.randint(0, model.config.vocab_size, (batch, seq), device=device)

    def fwd_bwd() -> None:
        if rank == 0:
            schedule.step(x)
        elif last:
            schedule.step(target=y, losses=[])
        else:
            schedule.step()

    def optimizer_step() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    started = time.perf_counter()
    fwd_bwd()
    optimizer_step()
    warm = time.perf_counter() - started
    params = list(stage_module.parameters())
    state = lambda: params + [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]  # noqa: E731
    out = _measure(fwd_bwd, optimizer_step, state, lambda: [p.grad for p in params if p.grad is not None])
    out.update(warm_step_s=warm, stage_blocks=list(bounds[rank]),
               local_param_bytes=sum(p.numel() * p.element_size() for p in params))
    return out


def _run_cp(model, mesh, batch: int, seq: int, device: str) -> dict:
    import torch
    from torch.distributed.tensor.experimental import context_parallel

    x = torch.randint(0, model.config.vocab_size, (batch, seq), device=device)
    y = torch.randint(0, model.config.vocab_size, (batch, seq), device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    params = list(model.parameters())

    def fwd_bwd() -> None:
        with context_parallel(mesh, buffers=[x, y], buffer_seq_dims=[1, 1]):
            model(x, y).backward()

    def optimizer_step() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    started = time.perf_counter()
    fwd_bwd()
    optimizer_step()
    warm = time.perf_counter() - started
    state = lambda: params + [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]  # noqa: E731
    out = _measure(fwd_bwd, optimizer_step, state, lambda: [p.grad for p in params if p.grad is not None])
    out["warm_step_s"] = warm
    return out


def _one(name: str) -> dict:
    """Run case ``name`` here (fake), or, under torchrun, this rank of its gloo twin; errors become a record."""
    gloo = name in GLOO
    layout, card, world, extra = CASES[GLOO.get(name, name)]
    try:
        return {"case": name, "ok": True, **run_case(layout, card, world, extra, fake=not gloo)}
    except Exception as exc:  # the spike's answer is the error itself
        return {"case": name, "ok": False, "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:400],
                "where": traceback.format_exc().strip().splitlines()[-3:]}


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _spawn(name: str, timeout: float) -> dict:
    started = time.perf_counter()
    if name in GLOO:
        import tempfile

        from pytest_flashckpt.distributed import launcher

        world = CASES[GLOO[name]][2]
        with tempfile.TemporaryDirectory() as tmp:
            cmd = launcher.Launch(world).command(__file__, ["--case", name, "--out", tmp])
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())
            ranks = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("rank-*.json"))]
        if done.returncode or len(ranks) != world:
            return {"case": name, "ok": False, "error": f"torchrun exit {done.returncode}: {done.stderr[-600:]}"}
        return {"case": name, "ok": all(r["ok"] for r in ranks), "ranks": ranks, "wall_s": time.perf_counter() - started}
    try:
        done = subprocess.run([sys.executable, __file__, "--case", name], capture_output=True, text=True,
                              timeout=timeout, env=_env())
    except subprocess.TimeoutExpired:
        return {"case": name, "ok": False, "error": f"did not finish within {timeout:.0f} s (killed)"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1][:400]
        return {"case": name, "ok": False, "error": f"process exit {done.returncode}: {tail}"}
    return {**json.loads(lines[-1]), "wall_s": time.perf_counter() - started}


def _mib(n) -> str:
    return f"{n / 2**20:,.2f} MiB" if isinstance(n, (int, float)) else "-"


def _render(results: dict, command: str, load: tuple, seconds: float) -> str:
    import torch

    from pytest_flashckpt.runner.profile import cpu_name

    lines = ["# Spike: real parallel layouts under FakeTensorMode + fake process group (issue 32)", "",
             f"Produced by `{command}` in {seconds:.0f} s on {platform.node()} ({os.cpu_count()} cores of {cpu_name()}, shared), "
             f"torch {torch.__version__}, Python {platform.python_version()}. Load average before / after: "
             f"{load[0][0]:.2f} / {load[1][0]:.2f} (1 min), {load[0][1]:.2f} / {load[1][1]:.2f} (5 min): wall times "
             "are on a loaded machine.", "",
             f"Cards at global batch {BATCH} x seq {SEQ} in float32 unless noted; `build` = model + layout, `warm` = "
             "first step, `fwd+bwd` / `opt` = the measured step's windows; bytes are rank 0's live tensor bytes "
             "(rank probe: DTensors as local shards), window start -> window peak.", "",
             "| case | runs? | build s | warm s | fwd+bwd s | opt s | process s | fwd+bwd start -> peak | opt start -> peak |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        if "ranks" in r:
            r0 = r["ranks"][0]
            r = {**r0, "wall_s": r["wall_s"], "ok": r["ok"]}
        if not r["ok"]:
            lines.append(f"| {name} | **no**: `{r.get('error', '')}` | | | | | {r.get('wall_s', 0):.1f} | | |")
            continue
        f = lambda k: f"{r[k]:.2f}" if k in r else "-"  # noqa: E731
        lines.append(f"| {name} | yes | {f('layout_s')} | {f('warm_step_s')} | {f('fwd_bwd_s')} | {f('optimizer_s')} | "
                     f"{r.get('wall_s', 0):.1f} | {_mib(r.get('fwd_bwd_start_bytes'))} -> {_mib(r.get('fwd_bwd_peak_bytes'))} | "
                     f"{_mib(r.get('optimizer_start_bytes'))} -> {_mib(r.get('optimizer_peak_bytes'))} |")
    lines += ["", "## Simulated (fake) against measured (gloo ranks), same code, rank by rank", "",
              "| case | rank | window | fake bytes | gloo bytes | fake - gloo |", "|---|---|---|---|---|---|"]
    for gloo_name, fake_name in GLOO.items():
        g, fk = results.get(gloo_name), results.get(fake_name)
        if not (g and fk and g.get("ok") and fk.get("ok")):
            lines.append(f"| {fake_name} | - | - | - | - | not compared: {(g or {}).get('error', '')}{(fk or {}).get('error', '')} |")
            continue
        for rr in g["ranks"]:
            for key in ("fwd_bwd_start_bytes", "fwd_bwd_peak_bytes", "optimizer_start_bytes", "optimizer_peak_bytes"):
                if rr["rank"] == 0:
                    lines.append(f"| {fake_name} | 0 | {key} | {fk[key]:,} | {rr[key]:,} | {fk[key] - rr[key]:+,} |")
                else:
                    lines.append(f"| {fake_name} | {rr['rank']} | {key} | (rank 0) | {rr[key]:,} | {fk[key] - rr[key]:+,} |")
    return "\n".join(lines)


def _raw(results: dict) -> str:
    return "\n".join([RAW, "", "```json", json.dumps(results, indent=1, default=str), "```", ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", help="run one case here and print its JSON (a gloo case: this torchrun rank)")
    parser.add_argument("--out", help="gloo case: the folder for rank-<r>.json")
    parser.add_argument("--only", nargs="*", help="driver: these cases only (default: all)")
    args = parser.parse_args(argv)
    if args.case:
        if args.case not in CASES and args.case not in GLOO:
            parser.error(f"--case {args.case!r}: unknown; valid: {', '.join([*CASES, *GLOO])}")
        record = _one(args.case)
        if args.out:
            import torch.distributed as dist

            rank = record.get("rank", int(os.environ.get("RANK", "0")))
            (Path(args.out) / f"rank-{rank}.json").write_text(json.dumps(record), encoding="utf-8")
            if dist.is_initialized():
                dist.destroy_process_group()
        print(json.dumps(record))
        return 0
    names = args.only or [*CASES, *GLOO]
    unknown = [n for n in names if n not in CASES and n not in GLOO]
    if unknown:
        parser.error(f"--only: unknown case(s) {', '.join(unknown)}; valid: {', '.join([*CASES, *GLOO])}")
    started, load = time.perf_counter(), [os.getloadavg()]
    results = {}
    for name in names:
        results[name] = _spawn(name, TIMEOUT_S.get(name, 240))
        print(name, "ok" if results[name].get("ok") else results[name].get("error"), f"{results[name].get('wall_s', 0):.1f}s", flush=True)
    load.append(os.getloadavg())
    command = "python benchmarks/spike_fake_layouts.py" + (f" --only {' '.join(names)}" if args.only else "")
    text = _render(results, command, tuple(load), time.perf_counter() - started)
    if args.only:
        print(text, _raw(results), sep="\n")
        return 0
    kept = REPORT.read_text(encoding="utf-8").partition(FINDINGS)[2].partition(RAW)[0] if REPORT.exists() else "\n"
    tmp = REPORT.with_suffix(".md.tmp")
    tmp.write_text(f"{text}\n\n{FINDINGS}{kept}{_raw(results)}", encoding="utf-8")
    tmp.replace(REPORT)
    print(f"wrote {REPORT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
