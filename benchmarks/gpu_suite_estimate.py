"""Estimate the GPU suite's wall time from the work it does, without a GPU: ``python benchmarks/gpu_suite_estimate.py``.

For every scenario it counts the training steps the runner takes (warm-up, memory pass, interleaved timing rounds
against the reference, the FLOP-counting step, the checkpoint pass's steps, and each reference's warm-up once per
run) and the FLOPs of one step: 6 x parameters x tokens for the matmuls plus 12 x layers x batch x seq^2 x width
for attention (score and value matmuls, forward and backward, full square: an upper bound for causal kernels),
times 4/3 for a fully recomputed forward. Time = FLOPs / an assumed sustained throughput (``--tflops``, default 250:
about a quarter of an H200's dense bf16 peak, what models of this size reach) + checkpoint bytes written and read
back / an assumed disk bandwidth (``--disk-GBps``, default 1.5) + a fixed per-scenario cost (model build, optimizer
state, allocator warm-up; ``--setup-s``, default 3) + for a compiled scenario an assumed cold compile of its blocks'
graph (``--compile-s``, default 30) twice: a compiled row compiles its own reference (docs/compile.md). The inputs are stated assumptions, printed with the result;
the measured wall time of a real run is what README reports.
"""

from __future__ import annotations

import argparse

from pytest_flashckpt.config.suites import load_suite
from pytest_flashckpt.models.cards import load_card


def step_flops(card, batch: int, seq: int, strategy: str) -> float:
    tokens = batch * seq
    flops = 6 * card.num_params() * tokens + 12 * card.n_layer * batch * seq * seq * card.n_embd
    return flops * (4 / 3 if strategy == "full" else 1.0)  # offload moves bytes instead (not modelled)


def scenario_steps(s) -> tuple[int, int]:
    """(steps of the scenario, steps of its reference that this scenario adds)."""
    steps, ref = max(s.warmup, 1), 0
    has_ref = not s.is_reference
    if "memory" in s.measure:
        steps += 1
    if "timing" in s.measure:
        steps += s.rounds * s.steps
        ref += s.rounds * s.steps if has_ref else 0
    if "flops" in s.measure:
        steps += 1
    if "checkpoint" in s.measure:
        c = s.save
        steps += c.saves * (c.save_interval + (c.max_defer_steps if c.mem_threshold else 0))
    return steps, ref


def state_bytes(card, dtype_bytes: int = 2) -> int:
    return card.num_params() * dtype_bytes * 3  # weights + AdamW exp_avg + exp_avg_sq, in the model's dtype


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="gpu")
    parser.add_argument("--tflops", type=float, default=250.0)
    parser.add_argument("--disk-GBps", type=float, default=1.5)
    parser.add_argument("--setup-s", type=float, default=3.0)
    parser.add_argument("--compile-s", type=float, default=30.0)
    args = parser.parse_args()
    suite = load_suite(args.suite)
    total = 0.0
    warmed: set[str] = set()
    print(f"{'scenario':45s} {'steps':>5s} {'TFLOP/step':>10s} {'ckpt GB':>8s} {'est s':>7s}")
    for s in suite.scenarios:
        card = load_card(s.card)
        steps, ref_steps = scenario_steps(s)
        flops = step_flops(card, s.batch_size, s.seq_len, s.activation.strategy)
        ref_flops = step_flops(card, s.batch_size, s.seq_len, "none")
        ref_key = repr((s.card, s.batch_size, s.seq_len, s.model.dropout, s.precision, s.compile))
        if not s.is_reference and ref_key not in warmed:
            warmed.add(ref_key)
            ref_steps += max(s.warmup, 1) + 1  # the reference's warm-up and memory pass, once per run
        ckpt_gb = 0.0
        if "checkpoint" in s.measure:
            # every save written, the newest read back and hashed; a non-sync strategy adds the reference's sync saves
            per_save = state_bytes(card) / 1e9
            ckpt_gb = per_save * (s.save.saves + 1) * (2 if s.save.strategy != "sync" else 1)
        seconds = (steps * flops + ref_steps * ref_flops) / (args.tflops * 1e12) + ckpt_gb / args.disk_GBps + args.setup_s
        seconds += 2 * args.compile_s if s.compile.enabled else 0.0
        total += seconds
        print(f"{s.name:45s} {steps + ref_steps:5d} {flops / 1e12:10.1f} {ckpt_gb:8.1f} {seconds:7.1f}")
    print(f"\n{len(suite.scenarios)} scenarios: estimated {total / 60:.1f} min at {args.tflops:g} TFLOP/s sustained, "
          f"{args.disk_GBps:g} GB/s disk, {args.setup_s:g} s setup each, {args.compile_s:g} s a compile")


if __name__ == "__main__":
    main()
