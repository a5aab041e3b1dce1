"""The simulated rank against real gloo ranks, same engine, for tp 2 (world 2) and dp_shard 2 x tp 2 (world 4).

    python benchmarks/fake_vs_gloo_layouts.py        # writes reports/fake-vs-gloo-layouts.md

The gloo side is the torchrun worker of tests/distributed/test_tensor_parallel.py (a 2-block Llama, float32,
batch 4 x 32: rank probe and CPU allocator per rank); the fake side is ``python -m
pytest_flashckpt.simulate.fake_ranks`` on the same card, layout, batch, seed and strategies, in one process.
``gloo - fake`` per window: what the real rank's live tensors hold that the simulated rank's do not.
``allocator - probe``: the CPU allocator's added peak over the probe's added peak in forward+backward, i.e. what
gloo allocates outside the dispatcher (its staging), measured apart.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "distributed"))

from tensor_parallel_worker import BATCH, CARD, SEED, SEQ  # noqa: E402  the gloo worker's card, one definition

from pytest_flashckpt.distributed import launcher  # noqa: E402

REPORT = ROOT / "reports" / "fake-vs-gloo-layouts.md"
WORKER = ROOT / "tests" / "distributed" / "tensor_parallel_worker.py"
LAYOUTS = ((1, 2), (2, 2))
STRATEGIES = ("none", "full", "selective_op")
WINDOWS = ("fwd_bwd_start_bytes", "fwd_bwd_peak_bytes", "optimizer_start_bytes", "optimizer_peak_bytes")


def gloo(dp: int, tp: int, out: Path) -> list[dict]:
    launcher.run(launcher.Launch(dp * tp, timeout_s=600), str(WORKER), [str(out), str(dp), str(tp), ",".join(STRATEGIES)],
                 log_path=out / "launch.log")
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(dp * tp)]


def fake(dp: int, tp: int) -> dict:
    cmd = [sys.executable, "-m", "pytest_flashckpt.simulate.fake_ranks", "llama-tiny", "--overrides", json.dumps(CARD),
           "--layouts", f"{dp}x{tp}", "--batch", str(BATCH), "--seq", str(SEQ), "--seed", str(SEED),
           "--strategies", ",".join(STRATEGIES)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    return json.loads(done.stdout.strip().splitlines()[-1])[f"{dp}x{tp}"]


def main() -> int:
    import torch

    lines = ["# The simulated rank against gloo ranks, same engine (issue 32)", "",
             f"Produced by `python benchmarks/fake_vs_gloo_layouts.py` on {platform.node()}, torch {torch.__version__}. "
             f"Card: llama-tiny with `{json.dumps(CARD)}`, float32, global batch {BATCH} x seq {SEQ}, seed {SEED}; "
             "fake = rank 0 simulated in one process, gloo = every real rank (torchrun).", "",
             "| layout | strategy | rank | window | fake bytes | gloo bytes | gloo - fake | allocator - probe (fwd+bwd) |",
             "|---|---|---|---|---|---|---|---|"]
    raw = {}
    for dp, tp in LAYOUTS:
        with tempfile.TemporaryDirectory() as tmp:
            ranks = gloo(dp, tp, Path(tmp))
        simulated = fake(dp, tp)
        raw[f"{dp}x{tp}"] = {"fake": simulated, "gloo": ranks}
        for strategy in STRATEGIES:
            sim = simulated[strategy]
            for record in ranks:
                real = record["strategies"][strategy]
                staging = real["allocator_fwd_bwd_added_bytes"] - (real["fwd_bwd_peak_bytes"] - real["fwd_bwd_start_bytes"])
                for window in WINDOWS:
                    extra = f"{staging:+,}" if window == "fwd_bwd_peak_bytes" else ""
                    lines.append(f"| dp_shard {dp} x tp {tp} | {strategy} | {record['rank']} | {window} | {sim[window]:,} | "
                                 f"{real[window]:,} | {real[window] - sim[window]:+,} | {extra} |")
    lines += ["", "## Raw records", "", "```json", json.dumps(raw, indent=1), "```", ""]
    tmp = REPORT.with_suffix(".md.tmp")
    tmp.write_text("\n".join(lines), encoding="utf-8")
    tmp.replace(REPORT)
    print(f"wrote {REPORT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
