"""Time and memory of one simulated training step (README "Will it fit?", speed).

    python benchmarks/simulate_speed.py --model gpt3-2.7b --seq 2048 --batch 8 --strategy full

Prints the wall time of ``simulate_step`` (model built on meta, a warm-up step and the measured step) and this
process's maximum resident set size; targets: 2.7B at 2048 tokens < 60 s and < 2 GB, 13B < 3 min.
"""

from __future__ import annotations

import argparse
import resource
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt3-2.7b")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--kernel", default="flash")
    parser.add_argument("--strategy", default="full")
    parser.add_argument("--world-size", type=int, default=1)
    args = parser.parse_args()
    started = time.perf_counter()
    from pytest_flashckpt.simulate import simulate_step

    imported = time.perf_counter()
    peak = simulate_step(args.model, args.dtype, args.batch, args.seq, args.kernel, args.strategy, world_size=args.world_size)
    done = time.perf_counter()
    rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30  # ru_maxrss is KiB on Linux
    print(f"{args.model} {args.dtype} batch {args.batch} seq {args.seq} {args.kernel} {args.strategy} "
          f"world {args.world_size}: peak {peak.peak_bytes / 2**30:.2f} GiB at {peak.peak_op} ({peak.peak_phase})")
    print(f"import {imported - started:.1f} s, simulate_step {done - imported:.1f} s, max RSS {rss_gib:.2f} GiB")


if __name__ == "__main__":
    main()
