"""Spike for issue 33 item 1 ("offload where it applies"): does ``offload`` (every block's saved tensors moved to host
memory by saved-tensor hooks, ``torch.autograd.graph.save_on_cpu`` on a GPU) still free device memory when the
blocks are compiled, and where may its hooks sit?

    python benchmarks/spike_compiled_offload.py            # writes reports/spike-compiled-offload.md
    python benchmarks/spike_compiled_offload.py --print

Offload applies on a GPU only (on a CPU there is no device memory to free: the strategy is refused there). What a
CPU can measure is what the hooks do to the memory the step's own allocator sees, with hooks that do to the CPU
allocator what a GPU offload does to a GPU's: pack keeps only a tensor's size, strides and dtype (the device copy is
let go), unpack allocates a tensor of that size and those strides (the copy back). That is
``simulate.costs.SimulatedOffload``'s idea, with strides kept, because a compiled backward asserts the strides of
what it saved (the finding below); data is not kept, so the gradients of those rows are not read. Gradients are
read with a real round trip through a host copy that keeps the strides (``host`` in ``_hooks``). Torch's own
``save_on_cpu(pin_memory=True)``, what the eager strategy runs on a GPU, gets a row of its own.

Per card (the tiny GPT and the tiny Llama at 4 x 256, fp32, the compiled suite's workload), each row a fresh model:

- ``eager none`` / ``eager offload``: the eager step, without and with the hooks around every block;
- ``compiled none``: every block compiled (Inductor, ``compile.scope: block``);
- ``compiled offload outside``: every block's own forward compiled, the hooks around the compiled call in eager (the
  wrapper outside, as ``compile.ac_wrapper: outside`` places a checkpoint): AOTAutograd's compiled function saves
  its tensors for backward through the ambient hooks, at run time;
- ``compiled offload inside``: the hooks entered inside the compiled block (the wrapper traced with the block);
- ``compiled model, offload around``: the whole model compiled (one region), the hooks around it;
- ``compiled full outside``: full checkpointing around each compiled block, for scale.

Read per row: the allocator's peak over the step's start (``probes.compiled.allocator_step``, what the compiled suite
reports), the compiled regions that ran, Dynamo's graph breaks, the bytes the pack hook saw, and (``save_on_cpu``
rows) the largest gradient difference from the eager reference. Recorded, not asserted; each row after two warm-up
steps.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CARDS = ("tiny", "llama-tiny")
BATCH, SEQ = 4, 256
ROWS = ("eager none", "eager offload", "compiled none", "compiled offload outside", "compiled offload outside, save_on_cpu",
        "compiled offload inside", "compiled model, offload around", "compiled full outside")


def _hooks(kind: str, packed: list[int]):
    """The hooks a row runs under, each counting the bytes it packs into ``packed[0]`` and the bytes those tensors
    span at their strides into ``packed[1]`` (more for a view that skips elements: a stride-keeping copy back is
    allocated at that extent):

    - ``simulated``: device memory as offload leaves it, no data (``SimulatedOffload``'s idea, with each tensor's
      strides kept: a compiled backward asserts the strides of what it saved);
    - ``host``: a real round trip through a host copy that keeps the strides (data kept, gradients comparable; a
      view's copy spans its base's extent, as ``empty_strided`` allocates);
    - ``save_on_cpu``: torch's own ``save_on_cpu(pin_memory=True)``, what the eager strategy runs on a GPU (its pack
      copies into a fresh contiguous tensor)."""
    import torch

    def counted(pack):
        def wrapper(tensor):
            packed[0] += tensor.numel() * tensor.element_size()
            extent = 1 + sum((n - 1) * step for n, step in zip(tensor.size(), tensor.stride())) if tensor.numel() else 0
            packed[1] += extent * tensor.element_size()
            return pack(tensor)
        return wrapper

    if kind == "simulated":
        def pack(tensor):
            return tensor.device, tensor.size(), tensor.stride(), tensor.dtype

        def unpack(saved):
            device, size, stride, dtype = saved
            return torch.empty_strided(size, stride, dtype=dtype, device=device)

        return lambda: torch.autograd.graph.saved_tensors_hooks(counted(pack), unpack)
    if kind == "host":
        def pack_host(tensor):  # a host copy with the tensor's own strides (clone and .to make a view contiguous)
            host = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device="cpu")
            return tensor.device, host.copy_(tensor)

        def unpack_host(saved):
            device, host = saved
            return torch.empty_strided(host.size(), host.stride(), dtype=host.dtype, device=device).copy_(host)

        return lambda: torch.autograd.graph.saved_tensors_hooks(counted(pack_host), unpack_host)

    class CountedSaveOnCpu(torch.autograd.graph.save_on_cpu):
        def __init__(self) -> None:
            super().__init__(pin_memory=True)
            self.pack_hook = counted(self.pack_hook)

    return CountedSaveOnCpu


def run_row(card_name: str, row: str, hooks_kind: str) -> dict:
    import torch
    from torch._dynamo.utils import counters

    from pytest_flashckpt import compile_step
    from pytest_flashckpt.activation.options import FULL, OFFLOAD
    from pytest_flashckpt.activation.wrapper import install_block_forwards
    from pytest_flashckpt.config.axes import CompileConfig
    from pytest_flashckpt.models.anatomy import get_anatomy, get_blocks
    from pytest_flashckpt.models.cards import build_model, load_card
    from pytest_flashckpt.probes.compiled import allocator_step, dynamos_hidden_warnings
    from pytest_flashckpt.training import Trainer

    torch._dynamo.reset()
    counters.clear()
    model = build_model(load_card(card_name), "sdpa", "cpu", torch.float32, seed=0)
    anatomy, blocks = get_anatomy(model), get_blocks(model)
    packed = [0, 0]
    hooks = _hooks(hooks_kind, packed)
    if row.startswith("compiled offload outside, save_on_cpu"):
        row, hooks_kind = "compiled offload outside", "save_on_cpu"
        hooks = _hooks(hooks_kind, packed)
    if row in ("eager offload", "compiled offload outside", "compiled offload inside"):
        forwards = install_block_forwards(model, blocks, anatomy, [OFFLOAD] * len(blocks))
        for forward in forwards:
            forward.offload_context = hooks
    elif row == "compiled full outside":
        install_block_forwards(model, blocks, anatomy, [FULL] * len(blocks))
    if row in ("compiled none", "compiled offload inside"):
        compile_step.compile_model(model, CompileConfig(scope="block"))
    elif row == "compiled offload outside":
        for forward in forwards:  # the block's own forward compiled, the offload wrapper in eager around it
            forward.forward = torch.compile(forward.forward)
    elif row == "compiled full outside":
        compile_step.compile_model(model, CompileConfig(scope="block", ac_wrapper="outside"))
    elif row == "compiled model, offload around":
        model.compile()
    trainer = Trainer.create(model, BATCH, SEQ, seed=0)
    around = hooks if row == "compiled model, offload around" else contextlib.nullcontext

    def step():
        with around():
            return trainer.train_step()

    with dynamos_hidden_warnings():
        started = time.perf_counter()
        try:
            for _ in range(2):
                step()
        except Exception as exc:  # what a placement fails with is the row's record
            return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"[:240], "graph_breaks":
                    sum(counters["graph_break"].values()), "break_reasons": sorted(counters["graph_break"])[:2],
                    "packed_bytes": packed[0], "grads": None}
        warm = time.perf_counter() - started
        grads_step = None
        if hooks_kind == "host":  # the gradients of one more step, before the optimizer moves the weights
            trainer.model.train()
            x, y = trainer.batch()
            with around():
                trainer.loss(x, y).backward()
            grads_step = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
            trainer.optimizer.zero_grad(set_to_none=True)
        packed[0] = packed[1] = 0
        peak, regions = allocator_step(step)
    return {"peak_bytes": peak, "regions": regions, "packed_bytes": packed[0], "packed_extent_bytes": packed[1], "warm_s": round(warm, 2),
            "graph_breaks": sum(counters["graph_break"].values()), "break_reasons": sorted(counters["graph_break"])[:2],
            "grads": grads_step}


def measure() -> dict:
    import torch

    out: dict = {}
    for card in CARDS:
        rows = {}
        reference = run_row(card, "eager none", "host")["grads"]
        for row in ROWS:
            record = run_row(card, row, "simulated")
            if "error" not in record and row != "eager none" and "offload" in row:
                real = run_row(card, row, "host")
                if real.get("error"):
                    record["grad_error"] = real["error"]
                else:
                    real = real["grads"]
                    record["grad_max_abs"] = max(float((real[n] - reference[n]).abs().max()) for n in reference)
                    record["grads_missing"] = sorted(set(reference) - set(real))
            record.pop("grads")
            rows[row] = record
            print(card, row, {k: v for k, v in record.items() if k != "break_reasons"}, flush=True)
        out[card] = rows
    out["_env"] = {"torch": torch.__version__, "host": platform.node(), "python": platform.python_version()}
    return out


def mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def render(data: dict) -> str:
    env = data["_env"]
    lines = [
        "# Spike: offload's saved-tensor hooks around compiled blocks (issue 33 item 1)", "",
        f"Produced by `python benchmarks/spike_compiled_offload.py` on {env['host']}, torch {env['torch']}, Python "
        f"{env['python']}. What each row runs and why memory is read with data-free hooks that keep strides and gradients "
        "with a host round trip that keeps them: the script's docstring. Peak: the CPU allocator's most bytes over the step's start (one step "
        "after two warm-up steps; parameters, gradients and AdamW state are resident, so a row's saving is the "
        "activations it lets go). *their extent*: what the packed tensors span at their strides (above the packed "
        "bytes where a saved tensor is a view that skips elements, as the tiny GPT's q, k, v of one qkv buffer; a "
        "stride-keeping copy back is allocated at that extent, and a compiled region brings back all it saved at "
        "the start of its backward, pytorch/pytorch#148222). *saved vs none*: 1 - peak / the same card's `compiled none` (compiled rows) or "
        "`eager none` (eager rows).", "",
    ]
    for card in CARDS:
        rows = data[card]
        lines += [f"## {card}, {BATCH} x {SEQ}, fp32", "",
                  "| row | peak | saved vs none | packed by the hooks | their extent | compiled regions | graph breaks | max abs grad diff vs eager none |",
                  "|---|---|---|---|---|---|---|---|"]
        failures = []
        for row in ROWS:
            r = rows[row]
            if "error" in r:
                lines.append(f"| {row} | failed (below) | | {mib(r['packed_bytes'])} before failing | | | {r['graph_breaks']} | |")
                failures.append(f"`{row}` failed in its warm-up steps: `{r['error']}`")
                continue
            base = rows["compiled none" if row.startswith("compiled") else "eager none"]["peak_bytes"]
            saved = "" if row in ("eager none", "compiled none") else f"{(1 - r['peak_bytes'] / base) * 100:+.1f}%"
            grad = "" if "grad_max_abs" not in r else f"{r['grad_max_abs']:.1e}" + (" (missing: " + ", ".join(r["grads_missing"]) + ")" if r["grads_missing"] else "")
            if "grad_error" in r:
                grad = "failed (below)"
                failures.append(f"`{row}` with the host round trip failed: `{r['grad_error']}`")
            lines.append(f"| {row} | {mib(r['peak_bytes'])} | {saved} | {mib(r['packed_bytes'])} | "
                         f"{mib(r['packed_extent_bytes'])} | {r['regions']} | "
                         f"{r['graph_breaks']} | {grad} |")
        lines += [""] + [f"- {f}" for f in failures]
        reasons = {row: rows[row]["break_reasons"] for row in ROWS if rows[row]["graph_breaks"]}
        for row, why in reasons.items():
            lines.append(f"\n`{row}` broke the graph: {why[0].splitlines()[0]}")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print the report instead of writing it")
    args = parser.parse_args()
    data = measure()
    text = render(data)
    if args.print:
        print(text)
        return
    (ROOT / "reports" / "spike-compiled-offload.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    (ROOT / "reports" / "spike-compiled-offload.md").write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
