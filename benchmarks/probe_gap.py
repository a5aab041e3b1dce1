"""Measure the cpu probe's blind spot: bytes the CPU allocator hands out during a training step that no
``TorchDispatchMode`` sees (0-dim tensors autograd and wrapped-number paths make from Python scalars outside the
dispatcher, e.g. the backward of ``0.5 * x`` in a hand-written GELU).

    python benchmarks/probe_gap.py [--out reports/probe-gap.md]

For each workload, one warm-up step, then the same step measured twice, independently: the ``cpu`` probe's added
peak and ``torch.profiler``'s allocator events (peak of the running total, from the event tree torch's memory
profiler reads). Besides the peaks, every allocation the profiler saw is matched against the storages the probe
saw (by address and size); the unmatched ones are the gap, listed by size and the op they were made under.
Workloads: our GPT (``tiny`` card, sdpa and eager) and, when ``transformers`` is installed (not a dependency of
this project), a randomly initialised Hugging Face GPT-2 with the same shape (no weights are downloaded).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Callable

import torch
from torch._C._profiler import _EventType

from pytest_flashckpt.models import build_model, load_card
from pytest_flashckpt.probes.cpu import LiveTensorProbe, _LiveStorages
from pytest_flashckpt.training import Trainer

ROOT = Path(__file__).resolve().parent.parent


def _walk(nodes):
    for node in nodes:
        yield node
        yield from _walk(node.children)


def _parent_op(event) -> str:
    node = event.parent
    while node is not None and node.tag != _EventType.TorchOp:
        node = node.parent
    return node.name if node is not None else "<no op>"


class _RecordingStorages(_LiveStorages):
    """The probe's own accounting, also remembering every (address, bytes) it counted."""

    def __init__(self) -> None:
        super().__init__("cpu")
        self.seen: set[tuple[int, int]] = set()

    def add(self, tensor: torch.Tensor) -> None:
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu":
            storage = tensor.untyped_storage()
            self.seen.add((storage.data_ptr(), storage.nbytes()))
        super().add(tensor)


def profiler_added_peak(step: Callable[[], None]) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    cpu = sorted((e for e in _walk(prof.profiler.kineto_results.experimental_event_tree())
                  if e.tag == _EventType.Allocation and str(e.extra_fields.device) == "cpu"), key=lambda e: e.start_time_ns)
    first = cpu[0].extra_fields
    return max(e.extra_fields.total_allocated for e in cpu) - (first.total_allocated - first.alloc_size)


def measure(step: Callable[[], None], resident: Callable[[], list[torch.Tensor]]) -> dict:
    step()  # warm-up: optimizer state and lazily made buffers exist from here on
    with LiveTensorProbe().track(resident=resident()) as reading:  # the probe alone, as a suite run uses it
        step()
    probe_added = reading.peak_bytes - reading.start_bytes
    alone = profiler_added_peak(step)  # the profiler alone, on the next (identical) step
    # diagnostic only: both at once, to match allocations to storages; the profiler's bookkeeping changes what the
    # probe sees (on the sdpa step it counts megabytes more), so the peaks compared are the separate ones above
    mode = _RecordingStorages()
    for t in resident():
        mode.add(t)
    mode_start = mode.live_bytes
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        with mode:
            step()
    events = sorted(
        (e for e in _walk(prof.profiler.kineto_results.experimental_event_tree()) if e.tag == _EventType.Allocation),
        key=lambda e: e.start_time_ns,
    )
    cpu = [e for e in events if str(e.extra_fields.device) == "cpu"]
    allocs = [e for e in cpu if e.extra_fields.alloc_size > 0]
    first = cpu[0].extra_fields
    profiler_added = max(e.extra_fields.total_allocated for e in cpu) - (first.total_allocated - first.alloc_size)
    unseen = [e for e in allocs if (e.extra_fields.ptr, e.extra_fields.alloc_size) not in mode.seen]
    by_kind = collections.Counter((e.extra_fields.alloc_size, _parent_op(e)) for e in unseen)
    return {
        "probe_added_peak_bytes": probe_added,
        "profiler_added_peak_bytes": alone,
        "peak_gap_bytes": alone - probe_added,
        "together_profiler_added_peak_bytes": profiler_added,
        "together_probe_added_peak_bytes": mode.peak_bytes - mode_start,
        "allocations": len(allocs),
        "allocated_bytes": sum(e.extra_fields.alloc_size for e in allocs),
        "unseen_allocations": len(unseen),
        "unseen_bytes": sum(e.extra_fields.alloc_size for e in unseen),
        "unseen_by_size_and_op": [{"bytes": size, "op": op, "count": n} for (size, op), n in by_kind.most_common(10)],
    }


def our_gpt(backend: str) -> tuple[Callable[[], None], Callable[[], list[torch.Tensor]]]:
    trainer = Trainer.create(build_model(load_card("tiny"), backend), batch_size=2, seq_len=256)
    return trainer.train_step, trainer.state_tensors


def hf_gpt2() -> tuple[Callable[[], None], Callable[[], list[torch.Tensor]]] | None:
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return None
    card = load_card("tiny")
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=card.vocab_size, n_positions=card.block_size, n_embd=card.n_embd,
                        n_layer=card.n_layer, n_head=card.n_head, attn_implementation="sdpa")
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, card.vocab_size, (2, 256), generator=torch.Generator().manual_seed(1))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(input_ids=idx, labels=idx).loss.backward()
        optimizer.step()

    def resident() -> list[torch.Tensor]:
        state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        return [*model.parameters(), *state, idx]

    return step, resident


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "reports" / "probe-gap.md"), help="markdown report; raw numbers go beside it (.json)")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch's default for this machine)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    workloads: dict[str, tuple] = {"our GPT tiny, sdpa": our_gpt("sdpa"), "our GPT tiny, eager": our_gpt("eager")}
    hf = hf_gpt2()
    if hf is not None:
        import transformers

        workloads[f"Hugging Face GPT-2 (transformers {transformers.__version__}), tiny shape"] = hf
    rows = {}
    notes: list[str] = []
    for name, (step, resident) in workloads.items():
        rows[name] = measure(step, resident)
        print(name, json.dumps(rows[name]), flush=True)
    lines = [
        "# The cpu probe's blind spot, measured",
        "",
        f"`python benchmarks/probe_gap.py` on torch {torch.__version__}, {torch.get_num_threads()} intra-op threads, batch 2 x 256 tokens, "
        "after a warm-up step, one step under the probe alone and the next under the profiler alone. *Added peak*: the "
        "step's peak minus what was live before it. *Unseen* (a third step under both, a diagnostic): allocations the "
        "profiler recorded whose (address, size) no tensor passing through the probe's `TorchDispatchMode` had; 4 and "
        "8 B ones are 0-dim tensors made outside the dispatcher, larger ones scratch memory inside one op.",
        "",
        "| workload | probe added peak (B) | profiler added peak (B) | peak gap (B) | allocations | unseen allocations | unseen bytes | unseen by size and op |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, r in rows.items():
        if r["together_probe_added_peak_bytes"] != r["probe_added_peak_bytes"]:
            notes.append(f"{name}: with the profiler running, the probe's added peak was {r['together_probe_added_peak_bytes']:,} B "
                         f"(alone {r['probe_added_peak_bytes']:,} B) and the profiler's {r['together_profiler_added_peak_bytes']:,} B "
                         f"(alone {r['profiler_added_peak_bytes']:,} B): the peaks compared above are the separate runs.")
        kinds = "; ".join(f"{k['count']} x {k['bytes']} B under {k['op']}" for k in r["unseen_by_size_and_op"]) or "none"
        lines.append(f"| {name} | {r['probe_added_peak_bytes']:,} | {r['profiler_added_peak_bytes']:,} | {r['peak_gap_bytes']:,} | "
                     f"{r['allocations']:,} | {r['unseen_allocations']:,} | {r['unseen_bytes']:,} | {kinds} |")
    if notes:
        lines += ["", *notes]
    if hf is None:
        lines += ["", "transformers is not installed here, so the Hugging Face GPT-2 row is missing (`pip install transformers`)."]
    out = Path(args.out)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps({"torch": torch.__version__, "workloads": rows}, indent=1) + "\n", encoding="utf-8")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
