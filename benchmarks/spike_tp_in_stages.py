"""Spike for issue 32 (3D, FSDP x TP x PP as torchtitan trains 405B-class models): does tensor + sequence parallel
run inside pipeline stages on gloo CPU ranks through torch's own APIs?

    python benchmarks/spike_tp_in_stages.py            # writes reports/spike-tp-in-stages.md
    python benchmarks/spike_tp_in_stages.py --print

One torchrun launch of pp 2 x tp 2 = 4 ranks per case (``spike_tp_in_stages_worker.py``): a 3D mesh
``init_device_mesh("cpu", (pp, dp_shard, tp))``, the blocks cut into stages (``distributed.pipeline.split_stage``),
each stage's blocks parallelized by ``parallelize_module`` with the family plan of ``distributed.tensor_parallel``
on the ``tp`` submesh (the embedding on the first stage, the final norm and head on the last), the local sequence
shard (rows, T / tp, C) sent between stages, the last stage's loss under ``loss_parallel``. Per case: whether one
schedule step runs, the loss and gradients against one process, or torch's error and where it was raised.
Times are one run's on a shared 2-core machine: recorded, not asserted.
"""

from __future__ import annotations

import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from report_output import print_only_flag, write_or_print  # noqa: E402

from pytest_flashckpt.distributed import launcher  # noqa: E402

WORKER = Path(__file__).with_name("spike_tp_in_stages_worker.py")
PP, TP = 2, 2
CASES = [("gpipe", "dtensor"), ("1f1b", "dtensor"), ("interleaved_1f1b", "dtensor"), ("1f1b", "local")]


def run_case(schedule: str, logits: str) -> tuple[list[dict], float, str]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        start = time.perf_counter()
        error = ""
        try:
            launcher.run(launcher.Launch(PP * TP, timeout_s=600), str(WORKER), [str(out), str(PP), str(TP), schedule, logits],
                         log_path=out / "launch.log")
        except launcher.LaunchError as exc:
            error = str(exc)
        ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
        return ranks, time.perf_counter() - start, error


def failure(ranks: list[dict], error: str) -> str:
    """Why a case did not run (a rank's error with where torch raised it, or the launch's), or "" if it ran."""
    failed = [r for r in ranks if "error" in r]
    if failed:
        return f"`{failed[0]['error']}` at `{failed[0]['raised_at']}`"
    if error or len(ranks) != PP * TP:
        return f"launch failed: `{error.splitlines()[0] if error else 'missing rank records'}`"
    return ""


def render(rows, command: str) -> str:
    import torch

    lines = ["# Spike: tensor parallel inside pipeline stages (pp x tp, issue 32)", "",
             f"Command: `{command}` ({platform.processor() or platform.machine()}, torch {torch.__version__}, gloo CPU "
             f"ranks). pp {PP} x tp {TP} (world {PP * TP}), mesh `(pp, dp_shard, tp)` = ({PP}, 1, {TP}); a 4-block "
             "Llama card (64 wide, 4 heads, 2 kv heads, vocab 256), batch 4 x 32 in 4 microbatches. `dtensor`: the "
             "head's logits leave the last stage as a vocabulary-sharded DTensor (torchtitan's plan, the stage's "
             "`output_args` a DTensor on meta); `local`: the local logits leave it and the loss function wraps them "
             "with `DTensor.from_local`. Gradients compared as `full_tensor()` against one process on the whole "
             "batch; times are one run's (recorded, not asserted).", "",
             "| schedule | logits | runs | loss, stage / one process | max abs grad difference | grads checked | "
             "step (rank 0) | launch |", "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for (schedule, logits), ranks, wall, error in rows:
        why = failure(ranks, error)
        if why:
            lines.append(f"| {schedule} | {logits} | **fails**: {why} | — | — | — | — | {wall:.0f} s |")
            continue
        losses = [r["loss"] for r in ranks if r["loss"] is not None]
        ref = ranks[0]["ref_loss"]
        grad = max(r["grad_max_abs"] for r in ranks)
        names = sum(r["n_grads"] for r in ranks) // TP
        lines.append(f"| {schedule} | {logits} | runs | {losses[0]:.7f} / {ref:.7f} (diff {abs(losses[0] - ref):.1e}) | "
                     f"{grad:.1e} | {names} per tp rank | {ranks[0]['step_s'] * 1000:.0f} ms | {wall:.0f} s |")
    ok = [f"{s} ({lg})" for (s, lg), ranks, _, err in rows if not failure(ranks, err)]
    lines += ["", f"Ran: {', '.join(ok) or 'none'} of {len(rows)} cases. Built from this: the `dtensor` rows run the "
              "package's stage build (`distributed.pipeline.make_mesh` with tp, `build_pipeline`, `apply_stage_tp`, "
              "`StageShapes` at T / tp with DTensor logits; tests/distributed/test_pipeline_tp.py checks it against one "
              "process and the fake rank); the `local` row is the spike's variant, kept in the worker only."]
    return "\n".join(lines) + "\n"


def main() -> None:
    print_only = print_only_flag(__doc__)
    rows = []
    for schedule, logits in CASES:
        ranks, wall, error = run_case(schedule, logits)
        rows.append(((schedule, logits), ranks, wall, error))
        print(f"{schedule} {logits}: {'error' if failure(ranks, error) else 'ok'} in {wall:.0f} s", file=sys.stderr)
    command = "python benchmarks/spike_tp_in_stages.py" + (" --print" if print_only else "")
    write_or_print(render(rows, command), ROOT / "reports" / "spike-tp-in-stages.md", print_only=print_only)


if __name__ == "__main__":
    main()
