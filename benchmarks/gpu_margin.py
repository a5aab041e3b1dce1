"""GPU truth for the will-it-fit margin: the simulated peak of a training step beside what the CUDA caching
allocator handed out and reserved for the same step on a GPU.

    python benchmarks/gpu_margin.py --out DIR [--rows gpt3-125m:none,llama3.2-1b:full] [--no-pickles]

The simulation (``simulate_step``, target cuda) counts live tensors exactly; a GPU needs more: the allocator rounds
every block to 512 B and reserves 2 MiB-or-larger segments, freed blocks stay cached and cut up (fragmentation),
and the CUDA context and some libraries' workspaces live outside the allocator. ``flashckpt fit`` keeps an *assumed*
margin for all of that (``fit.assumptions.DEFAULT_MARGIN``); this measures it. Per row (one card, one activation
strategy, bf16 at 2048 tokens):

- the simulated peak (what the project predicts);
- a warm-up step, then one step after ``reset_peak_memory_stats``: ``max_memory_allocated`` and
  ``max_memory_reserved`` (nothing emptied between the steps: the steady state a training job runs in), and the
  device memory outside the allocator (``mem_get_info``'s used minus reserved: context, library workspaces);
- one more step under ``_record_memory_history``: the snapshot (``DIR/snapshots/*.pickle``, torch's own format,
  for https://pytorch.org/memory_viz) and its summary (``probes.cuda_snapshot``: the most bytes the tensors asked
  for at once, what was reserved at that moment, the segments and free blocks after the step).

With two or more GPUs, also a 2-rank FSDP step (``distributed.fsdp``, started by the project's torchrun launcher,
each rank measured the same way) against the simulated rank ``flashckpt fit`` reads (``simulate_rank``); with one
GPU that row says why it is skipped. Writes ``DIR/gpu-margin.md`` and ``DIR/gpu-margin.json``; the last line
printed summarises the margins. Exits 1 with the reason when no CUDA device is present.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from pytest_flashckpt.probes.cuda_snapshot import summarise_segments, trace_peak

ROOT = Path(__file__).resolve().parents[1]
RANK_WORKER = ROOT / "benchmarks" / "gpu_margin_rank.py"
DTYPE = "bfloat16"
SEQ_LEN = 2048
# card -> global batch: small enough for a step in well under a second on one H200, large enough that activations
# are a real share of the peak (not only weights and AdamW state)
BATCH = {"gpt3-125m": 4, "llama3.2-1b": 2}
DEFAULT_ROWS = ("gpt3-125m:none", "gpt3-125m:full", "llama3.2-1b:none", "llama3.2-1b:full")
FSDP_ROW = "gpt3-125m:none"
FSDP_RANKS = 2
MAX_TRACE_ENTRIES = 2_000_000  # the history is a ring buffer: a step that fills it is reported as truncated
GIB = 2**30


# -- rows and margins (no GPU needed) -------------------------------------------------------------------------


@dataclass(frozen=True)
class MarginRow:
    """One measured step beside its simulation. ``rank`` is "" for one process, else "r/world"."""

    family: str
    card: str
    strategy: str
    batch_size: int
    seq_len: int
    simulated_bytes: int
    max_allocated_bytes: int
    max_reserved_bytes: int
    outside_allocator_bytes: int
    device_total_bytes: int
    command: str
    rank: str = ""
    backend: str = ""
    snapshot: dict = field(default_factory=dict)  # snapshot_record(): the recorded step's summary

    @property
    def allocated_margin(self) -> float:
        """max_memory_allocated / simulated - 1: block rounding, and what the simulation does not count."""
        return self.max_allocated_bytes / self.simulated_bytes - 1

    @property
    def reserved_margin(self) -> float:
        """max_memory_reserved / simulated - 1: the above plus cached, cut-up free blocks."""
        return self.max_reserved_bytes / self.simulated_bytes - 1

    @property
    def device_margin(self) -> float:
        """What the simulated peak leaves out, as a fraction of the device: reserved plus memory outside the
        allocator, minus simulated, over the device's total. The form of ``flashckpt fit --margin``."""
        return (self.max_reserved_bytes + self.outside_allocator_bytes - self.simulated_bytes) / self.device_total_bytes

    def to_dict(self) -> dict:
        return {**asdict(self), "allocated_margin": self.allocated_margin, "reserved_margin": self.reserved_margin,
                "device_margin": self.device_margin}


@dataclass(frozen=True)
class SkippedRow:
    label: str
    reason: str


def parse_rows(text: str) -> list[tuple[str, str]]:
    """``card:strategy,card:strategy`` -> [(card, strategy), ...]; a ValueError naming the malformed item."""
    rows = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        card, sep, strategy = item.partition(":")
        if not sep or not card or not strategy:
            raise ValueError(f"--rows item {item!r}: expected CARD:STRATEGY, e.g. gpt3-125m:full")
        rows.append((card, strategy))
    return rows


def batch_for(card: str, override: int | None = None) -> int:
    return override or BATCH.get(card, 1)


def snapshot_record(start: Mapping[str, Any], end: Mapping[str, Any], device: int, max_allocated_bytes: int,
                    max_entries: int = MAX_TRACE_ENTRIES) -> dict:
    """The recorded step in numbers: the history's peak (``probes.cuda_snapshot.trace_peak``), the segments after
    the step, and the allocator's own counter for the same step beside the replay (a check of the replay: the
    counter counts rounded blocks, so it is at least the replayed peak of requested bytes)."""
    peak = trace_peak(start, end, device)
    return {
        "trace": peak.to_dict(),
        "trace_truncated": peak.entries >= max_entries,
        "end": summarise_segments(end, device).to_dict(),
        "max_allocated_bytes": max_allocated_bytes,
        "rounding_bytes": max_allocated_bytes - peak.peak_requested_bytes,
    }


def pct(value: float) -> str:
    return f"{value:+.1%}"


def gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.3f}"


def row_label(row: MarginRow) -> str:
    return f"{row.card} {row.strategy}" + (f" rank {row.rank}" if row.rank else "")


def summary_line(rows: list[MarginRow], skipped: list[SkippedRow]) -> str:
    """The one line gpu_check.sh shows: the range of reserved/simulated - 1 and of the device-fraction margin."""
    if not rows:
        return f"gpu margin: no row measured ({len(skipped)} skipped)"
    reserved = [r.reserved_margin for r in rows]
    device = [r.device_margin for r in rows]
    return (f"gpu margin over {len(rows)} rows: reserved/simulated - 1 from {pct(min(reserved))} to {pct(max(reserved))}; "
            f"needed {min(device):.1%}-{max(device):.1%} of the device"
            + (f"; {len(skipped)} skipped" if skipped else ""))


MAIN_HEADER = ("| family | card | strategy | rank | simulated peak (GiB) | max_allocated (GiB) | max_reserved (GiB) | "
               "allocated/simulated - 1 | reserved/simulated - 1 | command |")
DETAIL_HEADER = ("| card | strategy | rank | backend | outside allocator (GiB) | needed, % of device | traced requested peak "
                 "(GiB) | reserved at that peak (GiB) | rounding (GiB) | segments | free after step (GiB) | largest free block (GiB) |")


def main_table_row(row: MarginRow) -> str:
    return (f"| {row.family} | {row.card} | {row.strategy} | {row.rank or '-'} | {gib(row.simulated_bytes)} | "
            f"{gib(row.max_allocated_bytes)} | {gib(row.max_reserved_bytes)} | {pct(row.allocated_margin)} | "
            f"{pct(row.reserved_margin)} | `{row.command}` |")


def skipped_table_row(skipped: SkippedRow) -> str:
    """A row that was not measured, with the reason where the card would be, in the main table's ten columns."""
    return f"| {skipped.label} | {skipped.reason} |" + " |" * 8


def detail_table_row(row: MarginRow) -> str:
    snap = row.snapshot
    trace, end = snap.get("trace", {}), snap.get("end", {})
    truncated = " (history truncated)" if snap.get("trace_truncated") else ""

    def cell(mapping: Mapping[str, Any], key: str) -> str:
        return gib(mapping[key]) if key in mapping else "-"

    return (f"| {row.card} | {row.strategy} | {row.rank or '-'} | {row.backend or '-'} | {gib(row.outside_allocator_bytes)} | "
            f"{row.device_margin:.2%} | {cell(trace, 'peak_requested_bytes')}{truncated} | "
            f"{cell(trace, 'reserved_at_peak_bytes')} | {cell(snap, 'rounding_bytes')} | {end.get('segments', '-')} | "
            f"{cell(end, 'free_bytes')} | {cell(end, 'largest_free_block_bytes')} |")


def render_report(rows: list[MarginRow], skipped: list[SkippedRow], context: Mapping[str, str], command: str) -> str:
    """The markdown report: every figure in it comes from ``rows`` (measured) or ``context`` (versions, device)."""
    lines = [
        "# GPU margin: simulated peak vs the CUDA caching allocator",
        "",
        f"Generated by `{command}` on {context.get('device', '?')} (torch {context.get('torch', '?')}, CUDA "
        f"{context.get('cuda', '?')}, PYTORCH_CUDA_ALLOC_CONF={context.get('alloc_conf') or 'unset'}), {DTYPE}, "
        f"{context.get('seq_len', SEQ_LEN)} tokens per sequence. Simulated: `simulate_step(..., target='cuda')` for one "
        "process, `simulate_rank` (as `flashckpt fit` reads a rank) for FSDP ranks. Measured: a warm-up step, then "
        "`reset_peak_memory_stats()` and one step (`max_memory_allocated`, `max_memory_reserved`); a third step under "
        "`_record_memory_history` for the snapshot columns.",
        "",
        MAIN_HEADER,
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
        *(main_table_row(r) for r in rows),
    ]
    lines += [skipped_table_row(s) for s in skipped]
    lines += [
        "",
        "*Outside allocator*: device memory in use (`mem_get_info`) less `memory_reserved` after the step (CUDA context, "
        "library workspaces not taken from torch's allocator). *Needed, % of device*: reserved plus outside, minus "
        "simulated, over the device's memory: the quantity `flashckpt fit --margin` assumes. *Traced requested "
        "peak*: the most bytes the step's tensors asked for at once, replayed from the recorded history "
        "(`probes.cuda_snapshot`); *rounding*: `max_memory_allocated` of that step minus it.",
        "",
        DETAIL_HEADER,
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *(detail_table_row(r) for r in rows),
        "",
        summary_line(rows, skipped),
    ]
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, rows: list[MarginRow], skipped: list[SkippedRow], context: Mapping[str, str],
                  command: str) -> Path:
    """``gpu-margin.md`` and ``gpu-margin.json`` (exact bytes) in ``out``; returns the report's path."""
    out.mkdir(parents=True, exist_ok=True)
    report = out / "gpu-margin.md"
    report.write_text(render_report(rows, skipped, context, command), encoding="utf-8")
    raw = {"command": command, "context": dict(context), "rows": [r.to_dict() for r in rows],
           "skipped": [asdict(s) for s in skipped]}
    (out / "gpu-margin.json").write_text(json.dumps(raw, indent=1) + "\n", encoding="utf-8")
    return report


# -- the allocator's counters (any torch.cuda-shaped object: tests hand a fake) ---------------------------------


def allocator_peaks(step: Callable[[], object], device, cuda=torch.cuda) -> dict[str, int]:
    """One call of ``step`` after ``reset_peak_memory_stats``: the allocator's peaks over it, and the device memory
    in use outside the allocator afterwards. Nothing is emptied first: cached blocks from earlier steps stay
    reserved, as in a training job."""
    cuda.synchronize(device)
    cuda.reset_peak_memory_stats(device)
    start_allocated, start_reserved = cuda.memory_allocated(device), cuda.memory_reserved(device)
    step()
    cuda.synchronize(device)
    free, total = cuda.mem_get_info(device)
    return {
        "start_allocated_bytes": start_allocated, "start_reserved_bytes": start_reserved,
        "max_allocated_bytes": cuda.max_memory_allocated(device), "max_reserved_bytes": cuda.max_memory_reserved(device),
        "outside_allocator_bytes": total - free - cuda.memory_reserved(device), "device_total_bytes": total,
    }  # fmt: skip


# -- on a GPU ------------------------------------------------------------------------------------------------


def require_cuda() -> None:
    """Exit 1 with the reason when torch sees no CUDA device: there is no allocator to measure."""
    if not torch.cuda.is_available():
        raise SystemExit(f"benchmarks/gpu_margin.py measures the CUDA caching allocator, and torch {torch.__version__} "
                         f"(CUDA build: {torch.version.cuda or 'none'}) sees no CUDA device here; run it on a GPU machine")


def recorded_step(step: Callable[[], object], device: torch.device, pickle_path: Path | None) -> dict:
    """One call of ``step`` under ``_record_memory_history`` (history cleared first), summarised by
    ``snapshot_record``; the snapshot after it is pickled to ``pickle_path`` (torch's format) when given."""
    memory = torch.cuda.memory
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=MAX_TRACE_ENTRIES,
                                  clear_history=True)
    try:
        start = memory._snapshot()
        step()
        torch.cuda.synchronize(device)
        end = memory._snapshot()
    finally:
        memory._record_memory_history(enabled=None)
    if pickle_path is not None:
        pickle_path.parent.mkdir(parents=True, exist_ok=True)
        with open(pickle_path, "wb") as f:
            pickle.dump(end, f)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return snapshot_record(start, end, index, torch.cuda.max_memory_allocated(device))


def measure_trainer(trainer, device: torch.device, pickle_path: Path | None) -> dict:
    """Warm-up step, the counted step, the recorded step (``Trainer.train_step`` each time)."""
    trainer.train_step()
    peaks = allocator_peaks(trainer.train_step, device)
    return {**peaks, "snapshot": recorded_step(trainer.train_step, device, pickle_path)}


def build_trainer(card_name: str, strategy: str, batch_size: int, seq_len: int, device: torch.device,
                  distributed: bool = False, attention: str = "auto"):
    """The project's trainer for ``card_name`` (``distributed.fsdp.build_trainer``: the card's model with the
    activation strategy applied, FSDP-sharded when ``distributed``), in bf16 with the backend ``attention``
    resolves to (``auto``: flash-attn where installed, else SDPA, whose bf16 CUDA kernel is the flash one the
    simulation's ``flash`` kernel models)."""
    from pytest_flashckpt.config.scenario import ActivationConfig
    from pytest_flashckpt.distributed.fsdp import build_trainer as fsdp_trainer
    from pytest_flashckpt.models.attention import resolve_backend
    from pytest_flashckpt.models.cards import load_card

    backend = resolve_backend(attention, device, torch.bfloat16)
    trainer, _ = fsdp_trainer(load_card(card_name), batch_size=batch_size, seq_len=seq_len, backend=backend,
                              device=device, dtype=torch.bfloat16, activation=ActivationConfig(strategy=strategy),
                              distributed=distributed)
    return trainer, backend


def family_of_card(card_name: str) -> str:
    from pytest_flashckpt.models.cards import load_card

    return load_card(card_name).family


def simulated_one_process(card: str, strategy: str, batch_size: int, seq_len: int) -> int:
    from pytest_flashckpt.simulate import simulate_step

    return simulate_step(card, DTYPE, batch_size=batch_size, seq_len=seq_len, kernel="flash", strategy=strategy,
                         target="cuda").peak_bytes


def simulated_ranks(card: str, strategy: str, batch_size: int, seq_len: int, world: int) -> list[int]:
    """Each rank's peak as ``flashckpt fit`` simulates it (``simulate_rank`` with fit's arguments)."""
    from pytest_flashckpt.config.layout import Layout
    from pytest_flashckpt.models.cards import load_card
    from pytest_flashckpt.simulate.fake_ranks import simulate_rank

    return [simulate_rank(load_card(card), Layout(dp_shard=world), batch_size=batch_size, seq_len=seq_len,
                          strategy=strategy, dtype=torch.bfloat16, rank=rank)["peak_bytes"] for rank in range(world)]


def release_cuda_memory() -> None:
    """Between rows: the previous trainer's tensors and cached blocks go, so each row starts from an empty cache."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def one_process_row(card: str, strategy: str, batch_size: int, out: Path, pickles: bool, command: str,
                    attention: str = "auto") -> MarginRow:
    device = torch.device("cuda", torch.cuda.current_device())
    simulated = simulated_one_process(card, strategy, batch_size, SEQ_LEN)
    release_cuda_memory()
    trainer, backend = build_trainer(card, strategy, batch_size, SEQ_LEN, device, attention=attention)
    pickle_path = out / "snapshots" / f"{card}-{strategy}.pickle" if pickles else None
    measured = measure_trainer(trainer, device, pickle_path)
    del trainer
    release_cuda_memory()
    return margin_row(family_of_card(card), card, strategy, batch_size, simulated, measured, command, backend=backend)


def margin_row(family: str, card: str, strategy: str, batch_size: int, simulated: int, measured: Mapping[str, Any],
               command: str, rank: str = "", backend: str = "") -> MarginRow:
    """A ``MarginRow`` from a simulated peak and ``measure_trainer``'s record."""
    return MarginRow(family, card, strategy, batch_size, SEQ_LEN, simulated, measured["max_allocated_bytes"],
                     measured["max_reserved_bytes"], measured["outside_allocator_bytes"], measured["device_total_bytes"],
                     command, rank=rank, backend=backend, snapshot=dict(measured.get("snapshot", {})))


def fsdp_rows(out: Path, pickles: bool, command: str, attention: str = "auto") -> tuple[list[MarginRow], list[SkippedRow]]:
    """The 2-rank FSDP step, one row per rank; skipped with the reason on fewer than two GPUs."""
    card, strategy = FSDP_ROW.split(":")
    label = f"FSDP {FSDP_RANKS} ranks, {card} {strategy}"
    count = torch.cuda.device_count()
    if count < FSDP_RANKS:
        return [], [SkippedRow(label, f"skipped: {count} GPU (torch.cuda.device_count() == {count}; the FSDP row needs "
                                      f"{FSDP_RANKS}, one rank per GPU)")]
    from pytest_flashckpt.distributed import launcher

    batch = batch_for(card)  # the global batch; each rank trains batch / FSDP_RANKS of it
    simulated = simulated_ranks(card, strategy, batch, SEQ_LEN, FSDP_RANKS)
    folder = out / "fsdp"
    folder.mkdir(parents=True, exist_ok=True)
    args = [str(folder), card, strategy, str(batch), str(SEQ_LEN), "1" if pickles else "0", attention]
    launcher.run(launcher.Launch(FSDP_RANKS, timeout_s=300), str(RANK_WORKER), args, log_path=folder / "launch.log")
    rows = []
    for rank in range(FSDP_RANKS):
        measured = json.loads((folder / f"rank-{rank}.json").read_text())
        rows.append(margin_row(family_of_card(card), card, strategy, batch, simulated[rank], measured, command,
                               rank=f"{rank}/{FSDP_RANKS}", backend=measured.get("backend", "")))
    return rows, []


def context() -> dict[str, str]:
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": str(torch.version.cuda),
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "seq_len": str(SEQ_LEN),
            "gpus": str(torch.cuda.device_count())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-margin"), help="folder for the report, JSON and snapshots")
    parser.add_argument("--rows", default=",".join(DEFAULT_ROWS), help="comma-separated CARD:STRATEGY rows")
    parser.add_argument("--batch", type=int, default=None, help="batch size for every row (default: per card)")
    parser.add_argument("--attention", default="auto", choices=("auto", "sdpa", "flash_attn"),
                        help="the measured step's attention backend (the simulation's kernel is flash either way)")
    parser.add_argument("--no-fsdp", action="store_true", help="leave out the 2-rank FSDP row")
    parser.add_argument("--no-pickles", action="store_true", help="summarise the snapshots without saving them")
    args = parser.parse_args(argv)
    command = shlex.join(["python", "benchmarks/gpu_margin.py", *(sys.argv[1:] if argv is None else argv)])
    rows_wanted = parse_rows(args.rows)
    require_cuda()
    rows: list[MarginRow] = []
    skipped: list[SkippedRow] = []
    for card, strategy in rows_wanted:
        started = time.perf_counter()
        row = one_process_row(card, strategy, batch_for(card, args.batch), args.out, not args.no_pickles, command,
                              args.attention)
        rows.append(row)
        print(f"{row_label(row)}: simulated {gib(row.simulated_bytes)} GiB, allocated {pct(row.allocated_margin)}, "
              f"reserved {pct(row.reserved_margin)} ({time.perf_counter() - started:.1f} s)", flush=True)
    if not args.no_fsdp:
        more, skips = fsdp_rows(args.out, not args.no_pickles, command, args.attention)
        rows += more
        skipped += skips
        for s in skips:
            print(f"{s.label}: {s.reason}", flush=True)
    report = write_outputs(args.out, rows, skipped, context(), command)
    print(report)
    print(summary_line(rows, skipped))
    return 0


if __name__ == "__main__":
    sys.exit(main())
