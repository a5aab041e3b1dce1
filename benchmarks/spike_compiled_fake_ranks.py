"""Spike for issue 32 item 4 with issue 33 item 4: can a compiled rank be simulated as an eager one is, by the real
engine in one process (``simulate.fake_ranks``: torch's fake process group, ``FakeTensorMode``) with Inductor's own
memory plan (``simulate.compiled.inductor_plans``: every region compiled by torch, its kernels stubbed)?

    python benchmarks/spike_compiled_fake_ranks.py            # writes reports/spike-compiled-fake-ranks.md
    python benchmarks/spike_compiled_fake_ranks.py --print

Per layout (tp 2 at world 2; dp_shard 2 x tp 2 at world 4) of the small Llama card of
``tests/distributed/tensor_parallel_worker.py`` (4 x 32, fp32), and per strategy a compiled tensor-parallel rank
trains (``none``, ``selective_op`` with the checkpoint inside the compiled block, ``full`` outside it), built as
``distributed.rank`` builds a compiled rank (the embedding's output settled, each block compiled before
``fully_shard``):

- **gloo**: two torchrun launches per layout, one per way Inductor's CPU buffers are allocated: ``helper``, its own
  fast path (``torch._C._dynamo.guards._empty_strided_cpu``, which skips the dispatcher: no dispatch mode sees a
  buffer only C++ kernels touch), and ``dispatched``, through ``torch.empty_strided`` while a dispatch mode is active
  (``probes.compiled.inductor_buffers_dispatched``: what ``distributed.rank`` runs a compiled rank under). Each rank
  warms up two steps, then reads one step with the rank probe made to run under compiled code
  (``simulate.rank_probe.CompiledRankProbe``: the rank probe of ``distributed.memory`` with
  ``ignore_compile_internals``, so Dynamo does not skip frames under it; three repeats), and five steps with the CPU
  allocator's events (``compile_step.read_step``: what the distributed suite reports for a compiled rank);
- **fake**: rank 0 of the same layout in a fresh process, the same build and probe under fake mode, the fake process
  group and Inductor's plans; no kernel runs.

What is read: whether the fake rank runs, its windows' starts and peaks against the gloo rank's probe (the eager fake
ranks equal them to the byte but for gloo's hold of finished collectives), against the allocator (which adds gloo's
staging), and the fake rank's wall time. Recorded, not asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "distributed"))

LAYOUTS = [(1, 2), (2, 2)]
STRATEGIES = ["none", "selective_op", "full:outside"]
BUFFERS = ("helper", "dispatched")  # how Inductor's CPU buffers are allocated on the gloo ranks (module docstring)
WINDOWS = ("fwd_bwd_start_bytes", "fwd_bwd_peak_bytes", "optimizer_start_bytes", "optimizer_peak_bytes")


def compiled_rank_probe():
    """The rank probe made to run under compiled code (``simulate.rank_probe.CompiledRankProbe``: Dynamo skips every
    frame under a dispatch mode unless it says ``ignore_compile_internals``), which here also keeps, at each new
    peak, the sizes of the live storages and the op that reached it (``extra``)."""
    from pytest_flashckpt.simulate.rank_probe import CompiledRankProbe, _CompiledRankStorages

    class _PeakRecordingStorages(_CompiledRankStorages):
        def _on_new_peak(self) -> None:
            super()._on_new_peak()
            self.peak_sizes = sorted(self._sizes.values())
            self.peak_op_text = str(self._op)

    class PeakRecordingProbe(CompiledRankProbe):
        mode_class = _PeakRecordingStorages

        def _read(self, mode, reading) -> None:
            super()._read(mode, reading)
            reading.extra.update(peak_sizes=getattr(mode, "peak_sizes", []), peak_op=getattr(mode, "peak_op_text", ""))

    return PeakRecordingProbe


def at_the_peak(trainer) -> dict:
    """One more forward + backward under the probe: its peak, the op that reached it, the live storages' sizes."""
    from pytest_flashckpt.distributed import tensor_parallel as tp

    with compiled_rank_probe()("cpu").track(resident=tp._local(trainer.state_tensors())) as reading:
        tp.forward_backward(trainer)
    trainer.optimizer.zero_grad(set_to_none=True)
    return {"peak_bytes": reading.peak_bytes, "op": reading.extra["peak_op"], "sizes": reading.extra["peak_sizes"]}


def compiled_trainer(layout, mesh, strategy: str, model=None):
    import torch  # noqa: F401

    from pytest_flashckpt import compile_step
    from pytest_flashckpt.config.axes import CompileConfig
    from pytest_flashckpt.config.scenario import ActivationConfig
    from pytest_flashckpt.distributed import tensor_parallel as tp

    from tensor_parallel_worker import BATCH, SEED, SEQ, card

    name, _, wrapper = strategy.partition(":")
    config = CompileConfig(scope="block", ac_wrapper=wrapper or "inside")  # type: ignore[arg-type]

    def compile_blocks(built) -> None:
        tp.settle_embedding_output(built)
        compile_step.compile_model(built, config)

    return tp.build_trainer(card(), layout, mesh, batch_size=BATCH, seq_len=SEQ, seed=SEED,
                            activation=ActivationConfig(name), model=model, before_shard=compile_blocks)[0]


def gloo_rank(out: Path, dp: int, tp_size: int, buffers: str) -> None:
    """Under torchrun: this rank's probe and allocator readings per strategy, written to ``out/rank-<r>.json``,
    Inductor's buffers allocated as ``buffers`` says (``BUFFERS``)."""
    import contextlib

    import torch
    import torch.distributed as dist

    from pytest_flashckpt import compile_step
    from pytest_flashckpt.config.layout import Layout
    from pytest_flashckpt.distributed import fsdp
    from pytest_flashckpt.distributed import tensor_parallel as tp
    from pytest_flashckpt.probes.compiled import inductor_buffers_dispatched

    fsdp.init(timeout_s=240)
    layout = Layout(dp_shard=dp, tp=tp_size)
    mesh = tp.make_mesh(layout)
    probe = compiled_rank_probe()
    record = {}
    for strategy in STRATEGIES:
        torch._dynamo.reset()
        with inductor_buffers_dispatched() if buffers == "dispatched" else contextlib.nullcontext():
            trainer = compiled_trainer(layout, mesh, strategy)
            record[strategy] = _gloo_readings(trainer, probe)
    (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(record), encoding="utf-8")
    dist.destroy_process_group()


def _gloo_readings(trainer, probe) -> dict:
    """Two warm-up steps (they compile), then three probed steps, five allocator steps and three peaks."""
    from pytest_flashckpt import compile_step
    from pytest_flashckpt.distributed import tensor_parallel as tp

    for _ in range(2):
        trainer.train_step()
    graphs = compile_step.dynamo_counts()[0]
    probed = [tp.memory_step(trainer, probe_class=probe) for _ in range(3)]
    added = [compile_step.read_step(trainer.train_step).added_peak_bytes for _ in range(5)]
    peaks = [at_the_peak(trainer) for _ in range(3)]
    return {"probe": probed, "allocator_added": added, "at_peak": min(peaks, key=lambda p: p["peak_bytes"]),
            "recompiles": compile_step.dynamo_counts()[0] - graphs}


def fake_rank(dp: int, tp_size: int, strategy: str) -> None:
    """Rank 0 of the layout under fake mode, compiled; one JSON line on stdout."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from pytest_flashckpt import compile_step
    from pytest_flashckpt.config.layout import Layout
    from pytest_flashckpt.distributed import tensor_parallel as tp
    from pytest_flashckpt.probes.compiled import dynamos_hidden_warnings, import_inductor
    from pytest_flashckpt.simulate import fake_ranks
    from pytest_flashckpt.simulate.compiled import inductor_plans

    from tensor_parallel_worker import SEED, card

    import_inductor()
    layout = Layout(dp_shard=dp, tp=tp_size)
    started = time.perf_counter()
    fake_ranks.forget_meshes()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=layout.world_size)
    try:
        mesh = tp.make_mesh(layout)
        with (FakeTensorMode(allow_non_fake_inputs=True), fake_ranks._real_meshes(), fake_ranks._eager_collectives(),
              inductor_plans() as plans):
            model = fake_ranks._build_fake(card(), "sdpa", torch.float32, SEED)
            trainer = compiled_trainer(layout, mesh, strategy, model)
            with dynamos_hidden_warnings():
                for _ in range(2):
                    trainer.train_step()
            warm = time.perf_counter()
            graphs = compile_step.dynamo_counts()[0]
            record = tp.memory_step(trainer, probe_class=compiled_rank_probe())
            record["at_peak"] = at_the_peak(trainer)
        record.update(regions=len(plans.regions), recompiles=compile_step.dynamo_counts()[0] - graphs,
                      warm_s=warm - started, measured_s=time.perf_counter() - warm)
    except Exception as exc:  # what the fake rank fails with is the finding
        record = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]}
    finally:
        dist.destroy_process_group()
    print(json.dumps(record), flush=True)


def run_layout(dp: int, tp_size: int) -> dict:
    from pytest_flashckpt.distributed import launcher

    ranks, wall = {}, {}
    for buffers in BUFFERS:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            wall[buffers] = launcher.run(launcher.Launch(dp * tp_size, timeout_s=600), str(Path(__file__).resolve()),
                                         ["--gloo", str(out), str(dp), str(tp_size), buffers], log_path=out / "launch.log")
            ranks[buffers] = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(dp * tp_size)]
    fake = {}
    for strategy in STRATEGIES:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--fake", str(dp), str(tp_size), strategy],
                              capture_output=True, text=True, timeout=600, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        fake[strategy] = json.loads(lines[-1]) if lines else {"error": f"exit {done.returncode}: {done.stderr[-300:]}"}
        fake[strategy]["process_s"] = time.perf_counter() - started
    return {"dp": dp, "tp": tp_size, "gloo_wall_s": wall, "ranks": ranks, "fake": fake}


def _sizes(counts: Counter) -> str:
    return ", ".join(f"{size:,} x {n}" for size, n in sorted(counts.items())) or "nothing"


def _layout_name(layout: dict) -> str:
    return f"dp_shard {layout['dp']} x tp {layout['tp']}" if layout["dp"] > 1 else f"tp {layout['tp']}"


def _against(fake: dict, real: dict) -> dict:
    """The fake rank's windows against one gloo rank's readings (its three probed steps, five allocator steps)."""
    probes = real["probe"]
    peaks = sorted({p["fwd_bwd_peak_bytes"] for p in probes})
    alloc = sorted(probes[0]["fwd_bwd_start_bytes"] + a for a in real["allocator_added"])
    return {"equal": all(fake[k] == p[k] for p in probes for k in WINDOWS if k != "fwd_bwd_peak_bytes"),
            "peaks": peaks, "gap": fake["fwd_bwd_peak_bytes"] - peaks[0], "alloc": alloc,
            "gap_alloc": fake["peak_bytes"] - alloc[0]}


def _range(values: list[int]) -> str:
    return f"{values[0]:,}" if values[0] == values[-1] else f"{values[0]:,}-{values[-1]:,}"


def render(layouts: list[dict], produced: str) -> str:
    lines = ["# Spike: compiled tensor-parallel ranks simulated under fake mode (issue 32 item 4, issue 33 item 4)", "",
             produced, "",
             "Per layout and strategy: rank 0's windows from the fake rank against the gloo rank's probe (three repeats: "
             "min-max where they moved), on gloo ranks whose Inductor buffers come from Inductor's own helper "
             "(`helper`: out of a dispatch mode's sight) and on ranks where they are allocated through the dispatcher "
             "(`dispatched`: what `distributed.rank` runs), and the allocator's whole-step peak of the `dispatched` ranks "
             "(state + added, five steps, min-max). Differences are fake - gloo.", "",
             "| layout | strategy | fake rank | starts and optimizer peak vs gloo probe | fwd+bwd peak: fake | "
             "gloo probe, helper | fake - probe | gloo probe, dispatched | fake - probe | allocator peak (gloo) | "
             "fake - allocator (min) | fake rank wall |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    summary = []
    for layout in layouts:
        name = _layout_name(layout)
        for strategy in STRATEGIES:
            fake = layout["fake"][strategy]
            if "error" in fake:
                lines.append(f"| {name} | {strategy} | fails: `{fake['error']}` |" + " |" * 8 + f" {fake['process_s']:.0f} s |")
                summary.append({"name": name, "strategy": strategy, "ran": False, "process_s": fake["process_s"]})
                continue
            by = {b: _against(fake, layout["ranks"][b][0][strategy]) for b in BUFFERS}
            helper, dispatched = by["helper"], by["dispatched"]
            equal = all(b["equal"] for b in by.values())
            summary.append({"name": name, "strategy": strategy, "ran": True, "equal": equal, "process_s": fake["process_s"],
                            **{f"{b}_gap": by[b]["gap"] / by[b]["peaks"][0] for b in BUFFERS},
                            **{f"{b}_bytes": by[b]["gap"] for b in BUFFERS},
                            "alloc_gap": dispatched["gap_alloc"] / dispatched["alloc"][0]})
            lines.append(
                f"| {name} | {strategy} | runs ({fake['regions']} Inductor graphs, {fake['recompiles']} recompiles) | "
                f"{'equal to the byte' if equal else '**differ**'} | {fake['fwd_bwd_peak_bytes']:,} B | "
                + " | ".join(f"{_range(by[b]['peaks'])} B | {by[b]['gap']:+,} B ({by[b]['gap'] / by[b]['peaks'][0]:+.1%})"
                             for b in BUFFERS)
                + f" | {_range(dispatched['alloc'])} B | {dispatched['gap_alloc']:+,} B "
                f"({dispatched['gap_alloc'] / dispatched['alloc'][0]:+.1%}) | "
                f"{fake['process_s']:.0f} s (warm-up {fake['warm_s']:.0f} s) |")
    lines += ["", "At the forward+backward peak (one more window each side; the gloo rank's lowest of three): the op that "
              "reached it, and the live storages one side holds that the other does not (bytes x count).", "",
              "| layout | strategy | peak op: fake | peak op: gloo, helper | only the fake rank holds (vs helper) | "
              "peak op: gloo, dispatched | only the fake rank holds (vs dispatched) | only the gloo rank holds (dispatched) |",
              "|---|---|---|---|---|---|---|---|"]
    for layout in layouts:
        for strategy in STRATEGIES:
            fake = layout["fake"][strategy].get("at_peak")
            if fake is None:
                continue
            helper, dispatched = (layout["ranks"][b][0][strategy]["at_peak"] for b in BUFFERS)
            held = Counter(fake["sizes"])
            lines.append(f"| {_layout_name(layout)} | {strategy} | `{fake['op']}` | `{helper['op']}` | "
                         f"{_sizes(held - Counter(helper['sizes']))} | `{dispatched['op']}` | "
                         f"{_sizes(held - Counter(dispatched['sizes']))} | {_sizes(Counter(dispatched['sizes']) - held)} |")
    ran = [s for s in summary if s["ran"]]
    lines += ["", "## What it says", ""]
    if not ran:
        lines.append("No compiled fake rank ran: the route is closed as tried here.")
        return "\n".join(lines) + "\n"

    def spread(key: str) -> str:
        return f"{min(s[key] for s in ran):+.1%} to {max(s[key] for s in ran):+.1%}"

    exact = sum(1 for s in ran if s["dispatched_bytes"] == 0)
    lines.append(
        f"{len(ran)} of {len(summary)} compiled fake ranks ran, each in {min(s['process_s'] for s in ran):.0f}-"
        f"{max(s['process_s'] for s in ran):.0f} s of one process. Window starts and the optimizer peak equal the gloo "
        f"rank's probe to the byte in {sum(1 for s in ran if s['equal'])} of {len(ran)}, both ways of allocating.")
    lines += ["", f"- **Inductor's helper**: the forward+backward peak is {spread('helper_gap')} off the gloo rank's "
              f"probe, above it in {sum(1 for s in ran if s['helper_bytes'] > 0)} of {len(ran)}. What the fake rank "
              "holds beyond it (the table above) are Inductor's buffers: the fake rank allocates them through "
              "`torch.empty_strided` (`simulate.compiled`), the gloo rank through a helper that skips the dispatcher, "
              "so its probe does not see a buffer that only C++ kernels touch before it is freed.",
              f"- **Buffers dispatched** (the same bytes from the same allocator, seen): "
              + (f"equal to the byte in {exact} of {len(ran)} (the gloo rank's lowest of three steps). " if exact == len(ran)
                 else f"{spread('dispatched_gap')} off, equal to the byte in {exact} of {len(ran)}. ")
              + "A gloo rank above the fake one holds what gloo's thread "
              "keeps of finished collectives (the eager fake ranks differ by that alone: "
              "reports/fake-vs-gloo-layouts.md).",
              f"- Against the allocator's whole step the fake rank reads {spread('alloc_gap')}: the allocator adds "
              "gloo's staging of the collectives, outside the dispatcher, which a fake rank does not model (NCCL has "
              "none: distributed.memory)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--gloo":
        gloo_rank(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        return
    if len(sys.argv) == 5 and sys.argv[1] == "--fake":
        fake_rank(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        return
    from report_output import print_only_flag, produced_by, write_or_print

    print_only = print_only_flag(__doc__)
    load = os.getloadavg()[0]
    layouts = []
    for dp, tp_size in LAYOUTS:
        layouts.append(run_layout(dp, tp_size))
        print(f"dp {dp} x tp {tp_size} done", file=sys.stderr)
    text = render(layouts, produced_by("spike_compiled_fake_ranks.py", load))
    if not print_only:
        (ROOT / "reports" / "spike-compiled-fake-ranks.json").write_text(json.dumps(layouts, indent=1) + "\n")
    write_or_print(text, ROOT / "reports" / "spike-compiled-fake-ranks.md", print_only=print_only)


if __name__ == "__main__":
    main()
