"""How long the simulated rank takes, and what it answers, for Llama-3-8B / 70B under FSDP x TP (issue 32).

    python benchmarks/fake_layouts.py                      # every case, writes reports/fake-layouts.md
    python benchmarks/fake_layouts.py --only 8b-fsdp8      # those cases, prints the table (writes nothing)

Each case is one fresh process running ``python -m pytest_flashckpt.simulate.fake_ranks`` (the code behind
``flashckpt simulate --tp``: torch's parallelize_module + fully_shard under FakeTensorMode, fake process group),
with a timeout; the wall time includes the torch import. Bytes are rank 0's live tensors (DTensor local shards),
bf16 pure precision, full activation checkpointing, seq 8192. The load average is printed: on the shared 2-core
machine wall times move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "reports" / "fake-layouts.md"
SEQ, STRATEGY, DTYPE = 8192, "full", "bfloat16"
# name -> (card, dp_shard, tp, global batch)
CASES = {
    "8b-fsdp8": ("llama3-8b", 8, 1, 8),
    "8b-fsdp4-tp2": ("llama3-8b", 4, 2, 8),
    "8b-tp8": ("llama3-8b", 1, 8, 1),
    "70b-fsdp4-tp2": ("llama3-70b", 4, 2, 8),
    "70b-fsdp8-tp8": ("llama3-70b", 8, 8, 8),
}
TIMEOUT_S = 900


def _run(name: str) -> dict:
    card, dp, tp, batch = CASES[name]
    cmd = [sys.executable, "-m", "pytest_flashckpt.simulate.fake_ranks", card, "--layouts", f"{dp}x{tp}", "--batch",
           str(batch), "--seq", str(SEQ), "--strategies", STRATEGY, "--dtype", DTYPE]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    started = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"did not finish within {TIMEOUT_S} s", "wall_s": time.perf_counter() - started}
    wall = time.perf_counter() - started
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
        return {"ok": False, "error": f"exit {done.returncode}: {tail}", "wall_s": wall}
    return {"ok": True, **json.loads(lines[-1])[f"{dp}x{tp}"][STRATEGY], "wall_s": wall}


def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"


def render(results: dict, load: tuple, command: str) -> str:
    import torch

    lines = ["# Simulated rank of Llama-3 under FSDP x TP: answers and time (issue 32)", "",
             f"Produced by `{command}` on {platform.node()} ({os.cpu_count()} cores, shared), torch {torch.__version__}. "
             f"Load average before / after: {load[0][0]:.2f} / {load[1][0]:.2f} (1 min): wall times are on a loaded machine.", "",
             f"Rank 0, {DTYPE} pure precision, activation strategy {STRATEGY}, seq {SEQ}; `build` = model + layout, `warm` = first "
             "step (unprobed), `measured` = the probed step (forward+backward, optimizer), `process` = the whole process "
             "with the torch import. Bytes: live tensors (local shards), window start -> peak.", "",
             "| case | layout | global batch | runs? | build s | warm s | measured s | process s | fwd+bwd start -> peak | optimizer start -> peak | per-rank peak |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        card, dp, tp, batch = CASES[name]
        head = f"| {name} | {card} dp_shard {dp} x tp {tp} | {batch} |"
        if not r["ok"]:
            lines.append(f"{head} **no**: {r['error']} | | | | {r['wall_s']:.0f} | | | |")
            continue
        lines.append(f"{head} yes | {r['layout_s']:.1f} | {r['warm_step_s']:.1f} | {r['measured_step_s']:.1f} | {r['wall_s']:.0f} | "
                     f"{_gib(r['fwd_bwd_start_bytes'])} -> {_gib(r['fwd_bwd_peak_bytes'])} | "
                     f"{_gib(r['optimizer_start_bytes'])} -> {_gib(r['optimizer_peak_bytes'])} | {_gib(r['peak_bytes'])} |")
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
