"""How long the simulated rank takes, and what it answers, for Llama-3-8B / 70B / 3.1-405B under FSDP x TP (issue 32).

    python benchmarks/fake_layouts.py                      # every case, writes reports/fake-layouts.md
    python benchmarks/fake_layouts.py --only 8b-fsdp8      # those cases, prints the table (writes nothing)

Each case is one fresh process running ``python -m pytest_flashckpt.simulate.fake_ranks`` (the code behind
``flashckpt simulate --tp``: torch's parallelize_module + fully_shard under FakeTensorMode, fake process group),
with a timeout; the wall time includes the torch import, the CPU time is the child's (user + system: what the load
of the shared 2-core machine does not move much). Bytes are rank 0's live tensors (DTensor local shards), bf16,
full activation checkpointing. A deep card is read off the line through three shallower depths
(``simulate.layer_extrapolation``); a case marked ``whole`` simulates every block (the check of the line, and the
time without it); ``modelled`` is the old FSDP route (``simulate_step(world_size=N)``: the step at batch / N plus a
formula for the all-gathered blocks), beside the engine's answer.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "reports" / "fake-layouts.md"
STRATEGY, DTYPE = "full", "bfloat16"
# name -> (card, dp_shard, tp, global batch, seq, precision, how: engine | whole | modelled)
CASES = {
    "8b-fsdp8": ("llama3-8b", 8, 1, 8, 8192, "pure", "engine"),
    "8b-fsdp4-tp2": ("llama3-8b", 4, 2, 8, 8192, "pure", "engine"),
    "8b-tp8": ("llama3-8b", 1, 8, 1, 8192, "pure", "engine"),
    "70b-fsdp8": ("llama3-70b", 8, 1, 8, 8192, "pure", "engine"),
    "70b-fsdp8-whole": ("llama3-70b", 8, 1, 8, 8192, "pure", "whole"),
    "70b-fsdp8-modelled": ("llama3-70b", 8, 1, 8, 8192, "pure", "modelled"),
    "70b-fsdp8-mixed": ("llama3-70b", 8, 1, 8, 8192, "mixed", "engine"),
    "70b-fsdp16": ("llama3-70b", 16, 1, 16, 8192, "pure", "engine"),
    "70b-fsdp64": ("llama3-70b", 64, 1, 64, 8192, "pure", "engine"),
    "70b-fsdp4-tp2": ("llama3-70b", 4, 2, 8, 8192, "pure", "engine"),
    "70b-fsdp8-tp8": ("llama3-70b", 8, 8, 8, 8192, "pure", "engine"),
    "405b-fsdp8": ("llama3.1-405b", 8, 1, 8, 8192, "pure", "engine"),
    "405b-fsdp16": ("llama3.1-405b", 16, 1, 16, 8192, "pure", "engine"),
    "405b-fsdp64": ("llama3.1-405b", 64, 1, 64, 8192, "pure", "engine"),
    "405b-fsdp8-tp8": ("llama3.1-405b", 8, 8, 8, 8192, "pure", "engine"),
    "405b-fsdp16-tp8-s131072": ("llama3.1-405b", 16, 8, 16, 131072, "pure", "engine"),
}
TIMEOUT_S = 900
MODELLED = """import json, sys, time
from pytest_flashckpt.simulate import simulate_step
from pytest_flashckpt.runner.profile import cpu_name
t = time.perf_counter()
p = simulate_step(sys.argv[1], "bf16", int(sys.argv[2]), int(sys.argv[3]), "flash", sys.argv[4], world_size=int(sys.argv[5]))
g = p.sharding["all_gathered_bytes"]
print(json.dumps({"peak_bytes": p.peak_bytes, "peak_phase": p.peak_phase, "all_gathered_bytes": g, "step_s": time.perf_counter() - t}))
"""


def _command(name: str) -> list[str]:
    card, dp, tp, batch, seq, precision, how = CASES[name]
    if how == "modelled":
        return [sys.executable, "-c", MODELLED, card, str(batch), str(seq), STRATEGY, str(dp)]
    return [sys.executable, "-m", "pytest_flashckpt.simulate.fake_ranks", card, "--layouts", f"{dp}x{tp}", "--batch",
            str(batch), "--seq", str(seq), "--strategies", STRATEGY, "--dtype", DTYPE, "--precision", precision,
            "--foreach", *(["--no-extrapolate"] if how == "whole" else [])]


def _run(name: str) -> dict:
    card, dp, tp, *_, how = CASES[name]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    started, cpu = time.perf_counter(), _children_cpu()
    try:
        done = subprocess.run(_command(name), capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"did not finish within {TIMEOUT_S} s", "wall_s": time.perf_counter() - started}
    wall, cpu = time.perf_counter() - started, _children_cpu() - cpu
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
        return {"ok": False, "error": f"exit {done.returncode}: {tail}", "wall_s": wall, "cpu_s": cpu}
    record = json.loads(lines[-1])
    return {"ok": True, **(record if how == "modelled" else record[f"{dp}x{tp}"][STRATEGY]), "wall_s": wall, "cpu_s": cpu}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"


BYTE_KEYS = ("peak_bytes", "fwd_bwd_start_bytes", "fwd_bwd_peak_bytes", "optimizer_start_bytes", "optimizer_peak_bytes",
             "largest_allgather_bytes")


def _checks(results: dict) -> list[str]:
    """Each extrapolated case against its whole-card run, and the engine's answer beside the modelled one."""
    lines = ["", "## Checks", ""]
    for name, whole in results.items():
        base = name.removesuffix("-whole")
        if name.endswith("-whole") and whole["ok"] and results.get(base, {}).get("ok"):
            same = all(results[base][k] == whole[k] for k in BYTE_KEYS)
            lines.append(f"- `{base}` read off depths {', '.join(map(str, results[base]['simulated_depths']))} against the "
                         f"{whole['n_layer']}-block card simulated whole: every window's start and peak "
                         f"{'equal to the byte' if same else 'DIFFER'}; CPU {results[base]['cpu_s']:.0f} s vs {whole['cpu_s']:.0f} s.")
        modelled = results.get(f"{base}-modelled")
        if name == base and modelled and modelled["ok"] and results[base]["ok"]:
            engine = results[base]
            lines.append(f"- `{base}`, old modelled route vs the engine: {_gib(modelled['peak_bytes'])} (in the "
                         f"{modelled['peak_phase']}; the meta step at batch / N with CUDA's flash op and foreach AdamW, "
                         f"{_gib(modelled['all_gathered_bytes'])} of all-gathered parameters added in forward and backward "
                         f"only) vs {_gib(engine['peak_bytes'])} = {engine['peak_bytes'] - modelled['peak_bytes']:+,} B "
                         f"(fully_shard under fake mode, CPU flash-attention op, AdamW foreach; optimizer window {_gib(engine['optimizer_start_bytes'])} -> "
                         f"{_gib(engine['optimizer_peak_bytes'])}: the local state and gradients, nothing all-gathered).")
    return lines if len(lines) > 3 else []


def render(results: dict, load: tuple, command: str) -> str:
    import torch

    lines = ["# Simulated rank of Llama-3 under FSDP x TP: answers and time (issue 32)", "",
             f"Produced by `{command}` on {platform.node()} ({os.cpu_count()} cores of {cpu_name()}, shared), torch {torch.__version__}. "
             f"Load average before / after: {load[0][0]:.2f} / {load[1][0]:.2f} (1 min): wall times are on a loaded machine.", "",
             f"Rank 0, {DTYPE}, activation strategy {STRATEGY}; `depths` = the depths simulated (the card's own: whole); "
             "`build`, `warm` (first step, unprobed) and `measured` (the probed step) are summed over the depths; "
             "`process` = the whole process with the torch import (wall), `CPU` = its user + system time. The engine's "
             "rank runs the CPU flash-attention op and AdamW foreach (CUDA's default, as `flashckpt simulate` runs it). "
             "Bytes: live tensors (local shards), window start -> peak.", "",
             "| case | layout | batch x seq | precision | depths | build s | warm s | measured s | process s | CPU s | fwd+bwd start -> peak | optimizer start -> peak | per-rank peak |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        card, dp, tp, batch, seq, precision, how = CASES[name]
        head = f"| {name} | {card} dp_shard {dp} x tp {tp} | {batch} x {seq} | {precision} |"
        cpu = f"{r['cpu_s']:.0f}" if "cpu_s" in r else ""
        if not r["ok"]:
            lines.append(f"{head} **no**: {r['error']} | | | | {r['wall_s']:.0f} | {cpu} | | | |")
        elif how == "modelled":
            lines.append(f"{head} modelled (meta step at batch / {dp}, CUDA flash kernel, foreach AdamW) | | | "
                         f"{r['step_s']:.1f} | {r['wall_s']:.0f} | {cpu} | in the {r['peak_phase']}, with "
                         f"{_gib(r['all_gathered_bytes'])} all-gathered counted in forward and backward | | {_gib(r['peak_bytes'])} |")
        else:
            depths = ", ".join(map(str, r["simulated_depths"])) if r.get("extrapolated") else f"{r['n_layer']} (whole)"
            lines.append(f"{head} {depths} | {r['layout_s']:.1f} | {r['warm_step_s']:.1f} | {r['measured_step_s']:.1f} | "
                         f"{r['wall_s']:.0f} | {cpu} | {_gib(r['fwd_bwd_start_bytes'])} -> {_gib(r['fwd_bwd_peak_bytes'])} | "
                         f"{_gib(r['optimizer_start_bytes'])} -> {_gib(r['optimizer_peak_bytes'])} | {_gib(r['peak_bytes'])} |")
    lines += _checks(results)
    lines += ["", "## Raw records", "", "```json", json.dumps(results, indent=1), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=list(CASES), help="these cases only; prints instead of writing")
    args = parser.parse_args(argv)
    names = args.only or list(CASES)
    load = [os.getloadavg()]
    results = {}
    for name in names:
        results[name] = _run(name)
        print(name, "ok" if results[name]["ok"] else results[name]["error"], f"{results[name]['wall_s']:.0f} s", flush=True)
    load.append(os.getloadavg())
    command = "python benchmarks/fake_layouts.py" + (f" --only {' '.join(names)}" if args.only else "")
    text = render(results, tuple(load), command)
    if args.only:
        print(text)
        return 0
    tmp = REPORT.with_suffix(".md.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(REPORT)
    print(f"wrote {REPORT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
