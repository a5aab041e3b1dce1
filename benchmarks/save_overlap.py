"""Side by side: what one save costs the training loop, for sync, our async (blocking copy), our overlapped async and
torch DCP's async_save (thread; with DCP's own asynchronous staging; process mode where this torch runs it on a CPU).

For every saver and state (the ``small`` card, ~170 MB of model + AdamW state, and a wider ``small`` of >= 1 GB):

* time lost per save: interleaved windows of K steps with one save vs K steps without
  (``pytest_flashckpt.checkpoint.time_lost``), median and per-round samples;
* stall: the save call (+ the fence at the next optimizer step, for overlapped savers);
* total: save call until committed;
* copy bound: state bytes / this machine's memory-copy bandwidth (the least a blocking in-memory snapshot costs).

Targets (issue 14, checked and reported, never asserted): overlapped stall <= 10% of the copy bound; overlapped time
lost <= 50% of DCP async_save's. Writes ``reports/save-overlap.md`` and ``reports/save-overlap.json``.

    python benchmarks/save_overlap.py --repeats 5            # both states
    python benchmarks/save_overlap.py --repeats 3 --states small
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from concurrent.futures import Future
from pathlib import Path

import torch

from pytest_flashckpt.checkpoint import Checkpointer, copy_bandwidth_GBps, dcp_io
from pytest_flashckpt.checkpoint.state import capture
from pytest_flashckpt.checkpoint.time_lost import measure_time_lost
from pytest_flashckpt.config.scenario import SaveConfig
from pytest_flashckpt.models import build_model, load_card
from pytest_flashckpt.training import Trainer

STATES = {
    # name: (card overrides, batch, seq_len)
    "small": ({}, 2, 256),
    "wide-1GB": ({"n_embd": 768, "n_head": 12, "n_layer": 12}, 1, 64),
}
OURS = {
    "sync": SaveConfig(strategy="sync"),
    "async-blocking": SaveConfig(strategy="async"),
    "async-overlapped": SaveConfig(strategy="async", staging="overlapped"),
    "dcp-async": SaveConfig(strategy="dcp", async_save=True),
}


class DcpSaver:
    """torch DCP ``async_save`` with options our ``dcp`` strategy does not set: DCP's own asynchronous staging
    (``DefaultStager(StagingOptions(use_async_staging=True))``, fenced before the next optimizer step as torchtitan
    does) or the process-based checkpointer. Writes plain DCP folders (no manifest: a benchmark, not a store)."""

    def __init__(self, root: Path, trainer: Trainer, process: bool = False, async_staging: bool = False) -> None:
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        self.root, self.n = root, 0
        self.kind = AsyncCheckpointerType.PROCESS if process else AsyncCheckpointerType.THREAD
        cuda = torch.cuda.is_available()
        self.stager = (lambda: DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=True,
                                                            use_non_blocking_copy=cuda))) if async_staging else None
        self.upload: Future | None = None
        self.staging: Future | None = None
        self.records: list[dict] = []
        self._start = 0.0
        self._hook = trainer.optimizer.register_step_pre_hook(self._fence)

    def _fence(self, *args) -> None:
        if self.staging is not None:
            t0 = time.perf_counter()
            self.staging.result()
            self.records[-1]["stall_s"] += time.perf_counter() - t0
            self.staging = None

    def save(self, trainer: Trainer) -> None:
        self.wait()
        start = time.perf_counter()
        self.n += 1
        tensors = dict(capture(trainer).tensors)
        kwargs = {"async_checkpointer_type": self.kind}
        if self.stager is not None:
            kwargs["async_stager"] = self.stager()
        out = torch.distributed.checkpoint.async_save(tensors, checkpoint_id=str(self.root / f"save-{self.n}"), **kwargs)
        if hasattr(out, "upload_completion"):
            self.staging, self.upload = out.staging_completion, out.upload_completion
        else:
            self.upload = out
        self._start = start
        self.records.append({"stall_s": time.perf_counter() - start, "total_s": None})

    def wait(self) -> None:
        self._fence()
        if self.upload is not None:
            self.upload.result()
            self.records[-1]["total_s"] = time.perf_counter() - self._start
            self.upload = None
            shutil.rmtree(self.root / f"save-{self.n - 1}", ignore_errors=True)

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._hook.remove()


def make_trainer(state: str) -> Trainer:
    overrides, batch, seq = STATES[state]
    card = dataclasses.replace(load_card("small"), **overrides)
    trainer = Trainer.create(build_model(card, "sdpa", seed=0), batch_size=batch, seq_len=seq)
    trainer.train_step()  # optimizer state exists
    return trainer


def run_saver(name: str, trainer: Trainer, workdir: Path, repeats: int, steps: int) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    if name in OURS:
        cfg = dataclasses.replace(OURS[name], max_keep=1, save_interval=steps)
        ckpt = Checkpointer(workdir, cfg)
        try:
            lost = measure_time_lost(trainer, cfg, workdir, rounds=repeats, steps=steps, saver=ckpt)
        finally:
            ckpt.close()
        records = ckpt.records[1:]  # the first save is the untimed warm-up
        stall = [r.save_stall_s for r in records]
        total = [r.save_total_s for r in records]
    else:
        with dcp_io.process_group():
            saver = DcpSaver(workdir, trainer, process=name.endswith("process"), async_staging=name.endswith("staging"))
            try:
                lost = measure_time_lost(trainer, SaveConfig(strategy="dcp", async_save=True), workdir, rounds=repeats, steps=steps, saver=saver)
            finally:
                saver.close()
        stall = [r["stall_s"] for r in saver.records[1:]]
        total = [r["total_s"] for r in saver.records[1:]]
    return {
        "time_lost_s": lost["time_lost_s"],
        "time_lost_s_samples": lost.samples["time_lost_s"],
        "time_lost_min_s": lost["time_lost_min_s"],
        "time_lost_max_s": lost["time_lost_max_s"],
        "plain_window_s": lost["time_lost_plain_s"],
        "stall_s": statistics.median(stall),
        "stall_s_samples": stall,
        "total_s": statistics.median([t for t in total if t is not None]),
    }


SAVERS = [*OURS, "dcp-async-staging", "dcp-async-process"]
LABELS = {
    "sync": "sync (ours)",
    "async-blocking": "async, blocking copy (ours)",
    "async-overlapped": "async, overlapped copy (ours)",
    "dcp-async": "DCP async_save (thread)",
    "dcp-async-staging": "DCP async_save (thread, DCP async staging, fenced)",
    "dcp-async-process": "DCP async_save (process)",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="interleaved rounds per saver (time-lost samples)")
    ap.add_argument("--steps", type=int, default=2, help="training steps per window (K)")
    ap.add_argument("--states", default=",".join(STATES), help=f"comma-separated, from {', '.join(STATES)}")
    ap.add_argument("--savers", default=",".join(SAVERS), help="comma-separated saver names")
    ap.add_argument("--out", type=Path, default=Path("reports/save-overlap"), help="report path without suffix")
    ap.add_argument("--workdir", type=Path, default=None, help="where checkpoints are written (default: a temporary folder)")
    args = ap.parse_args(argv)
    savers = [s for s in args.savers.split(",") if s]
    unknown = [s for s in savers if s not in SAVERS]
    states = [s for s in args.states.split(",") if s]
    if unknown or any(s not in STATES for s in states):
        ap.error(f"unknown saver/state: {unknown or states}; savers: {SAVERS}; states: {list(STATES)}")
    root = Path(tempfile.mkdtemp(prefix="save-overlap-", dir=args.workdir))
    copy_gbps = copy_bandwidth_GBps()
    out: dict = {"command": " ".join(["python", "benchmarks/save_overlap.py", *(argv if argv is not None else sys.argv[1:])]),
                 "machine": {"platform": platform.platform(), "cpus": torch.get_num_threads(), "torch": torch.__version__,
                             "load_average_at_start": os.getloadavg()[0]},
                 "copy_GBps": copy_gbps, "repeats": args.repeats, "steps": args.steps, "states": {}}
    try:
        for state in states:
            trainer = make_trainer(state)
            nbytes = capture(trainer).nbytes
            entry = {"state_bytes": nbytes, "copy_bound_s": nbytes / (copy_gbps * 1e9), "savers": {}}
            out["states"][state] = entry
            for i, name in enumerate(savers):
                print(f"[{state}] {name} ...", flush=True)
                try:
                    entry["savers"][name] = run_saver(name, trainer, root / state / str(i), args.repeats, args.steps)
                except Exception as exc:  # a mode this torch cannot run here is reported, not hidden
                    entry["savers"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                    traceback.print_exc()
                shutil.rmtree(root / state / str(i), ignore_errors=True)
                write(out, args.out)  # after every saver: a long run interrupted still leaves what it measured
            del trainer
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["complete"] = True
    write(out, args.out)
    print(markdown(out))
    return 0


def write(out: dict, path: Path) -> None:
    out["targets"] = targets(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    path.with_suffix(".md").write_text(markdown(out), encoding="utf-8")


def targets(out: dict) -> dict:
    """Issue 14's targets per state, from the measured numbers (None where a saver is missing)."""
    result = {}
    for state, entry in out["states"].items():
        s = entry["savers"]
        ov, dcp = s.get("async-overlapped", {}), s.get("dcp-async", {})
        stall_ratio = ov["stall_s"] / entry["copy_bound_s"] if "stall_s" in ov else None
        lost_ratio = ov["time_lost_s"] / dcp["time_lost_s"] if "time_lost_s" in ov and dcp.get("time_lost_s") else None
        result[state] = {
            "overlapped_stall_vs_copy_bound": stall_ratio, "stall_target": 0.10, "stall_met": stall_ratio is not None and stall_ratio <= 0.10,
            "overlapped_time_lost_vs_dcp_async": lost_ratio, "time_lost_target": 0.50, "time_lost_met": lost_ratio is not None and 0 <= lost_ratio <= 0.50,
        }
    return result


def _ms(v) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def markdown(out: dict) -> str:
    lines = ["# Save overlap: what one save costs the training loop", "",
             f"Command: `{out['command']}`  ", f"Machine: {out['machine']['platform']}, {out['machine']['cpus']} threads, torch {out['machine']['torch']}; "
             f"load average at start {out['machine'].get('load_average_at_start', float('nan')):.1f}; memory copy {out['copy_GBps']:.2f} GB/s; {out['repeats']} interleaved rounds of {out['steps']} steps with one save vs without.", "",
             "Time lost = median over rounds of (window with one save, waited until committed) - (same window without); "
             "stall = save call + fence at the next optimizer step; copy bound = state bytes / memory-copy bandwidth.", ""]
    if not out.get("complete"):
        lines += ["**Partial run**: the command was interrupted; the rows below are the savers it finished.", ""]
    for state, entry in out["states"].items():
        lines += [f"## `{state}`: {entry['state_bytes'] / 1e6:.0f} MB of state, copy bound {_ms(entry['copy_bound_s'])} ms", "",
                  "| saver | time lost per save (ms) | spread min..max (ms) | stall (ms) | stall / copy bound | total (ms) |",
                  "|---|---:|---:|---:|---:|---:|"]
        for name, r in entry["savers"].items():
            if "error" in r:
                lines.append(f"| {LABELS[name]} | not run: {r['error']} | | | | |")
                continue
            lines.append(f"| {LABELS[name]} | {_ms(r['time_lost_s'])} | {_ms(r['time_lost_min_s'])}..{_ms(r['time_lost_max_s'])} | {_ms(r['stall_s'])} | "
                         f"{r['stall_s'] / entry['copy_bound_s']:.2f} | {_ms(r['total_s'])} |")
        t = out["targets"][state]
        fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        lines += ["", f"Targets: overlapped stall / copy bound = {fmt(t['overlapped_stall_vs_copy_bound'])} (target <= 0.10: "
                  f"{'met' if t['stall_met'] else 'NOT met'}); overlapped time lost / DCP async_save's = {fmt(t['overlapped_time_lost_vs_dcp_async'])} "
                  f"(target <= 0.50: {'met' if t['time_lost_met'] else 'NOT met'}).", ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
