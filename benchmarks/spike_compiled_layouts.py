"""Spike for issue 32 item 7: do parallel layouts compose with ``torch.compile`` as torchtitan composes them (TP, then
activation checkpointing, then compile per block, then FSDP2), on gloo CPU ranks with torch's Inductor?

    python benchmarks/spike_compiled_layouts.py            # writes reports/spike-compiled-layouts.md
    python benchmarks/spike_compiled_layouts.py --print

One torchrun launch of 2 ranks per (layout, strategy): FSDP2 alone (dp_shard 2) and tensor parallel alone (tp 2),
each with no checkpointing and with ``full``, tensor parallel with ``every_k``, ``selective_op`` and
``compile_budget`` (torch's ``activation_memory_budget`` 0.5; its eager side checkpoints nothing) too, and ``full`` /
``every_k`` with the checkpoint *outside* the compiled region (``:outside``: each block's own forward compiled, the
strategy's ``torch.utils.checkpoint`` around the compiled call in eager; torch documents both orders); a compiled tensor-parallel
model has its embedding's output settled first (``tensor_parallel.settle_embedding_output``: without it every
compiled tensor-parallel row failed in backward, docs/compile.md); in each rank the eager step, then the compiled step
(``spike_compiled_layouts_worker.py``). What is read: whether the compiled side runs, Dynamo's graphs and graph
breaks, the compiled regions a step runs, its loss against the eager side's after 3 steps (same seed, same data),
first-step (compile) and step times; a side that fails is recorded with torch's error and where it was raised.
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

WORKER = Path(__file__).with_name("spike_compiled_layouts_worker.py")
CASES = [(2, 1, "none"), (2, 1, "full"), (1, 2, "none"), (1, 2, "full"), (1, 2, "every_k"), (1, 2, "selective_op"),
         (1, 2, "compile_budget"),
         # the checkpoint outside the compiled region (``:outside``: ``compile.ac_wrapper: outside``)
         (2, 1, "full:outside"), (1, 2, "full:outside"), (1, 2, "every_k:outside")]


def run_case(dp: int, tp: int, strategy: str) -> tuple[dict, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        start = time.perf_counter()
        launcher.run(launcher.Launch(dp * tp, timeout_s=600), str(WORKER), [str(out), str(dp), str(tp), strategy],
                     log_path=out / "launch.log")
        return json.loads((out / "rank-0.json").read_text()), time.perf_counter() - start


def _cell(side: dict, key: str, fmt=str) -> str:
    return "—" if key not in side else fmt(side[key])


def render(rows: list[tuple[tuple[int, int, str], dict, float]], command: str) -> str:
    import torch

    lines = ["# Spike: parallel layouts with torch.compile per block (issue 32 item 7)", "",
             f"Command: `{command}` ({platform.processor() or platform.machine()}, torch {torch.__version__}, gloo CPU "
             "ranks, Inductor). Order as torchtitan: TP, activation checkpointing, `block.compile()` per block, "
             "FSDP2; under tensor parallel the embedding's asynchronous output is waited for in eager before the compiled "
             "blocks (`tensor_parallel.settle_embedding_output`). llama-tiny, batch 4 x 256, rank 0's record; times "
             "are one run's (recorded, not asserted); Inductor's "
             "caches are on, so a later case may reuse an earlier one's kernels (its first compiled step is shorter).", "",
             "| layout | strategy | eager step | compiled | first compiled step | compiled step | graphs / breaks | "
             "regions per step | loss after 3 steps, eager / compiled | launch |",
             "| --- | --- | ---: | --- | ---: | ---: | --- | ---: | --- | ---: |"]
    for (dp, tp, strategy), record, wall in rows:
        eager, comp = record["eager"], record["compiled"]
        ms = lambda v: f"{v * 1000:.0f} ms"  # noqa: E731
        ok = "error" not in comp
        status = "runs" if ok else f"**fails**: `{comp['error']}` at `{comp['raised_at']}`"
        loss = (f"{eager['loss_after_3']:.6f} / {comp['loss_after_3']:.6f}"
                + (" (equal)" if comp["loss_after_3"] == eager["loss_after_3"] else
                   f" (differ by {abs(comp['loss_after_3'] - eager['loss_after_3']):.1e})")) if ok else "—"
        lines.append(f"| dp_shard {dp} x tp {tp} | {strategy} | {_cell(eager, 'step_s', ms)} | {status} | "
                     f"{_cell(comp, 'first_step_s', ms)} | {_cell(comp, 'step_s', ms)} | "
                     f"{_cell(comp, 'graphs')} / {_cell(comp, 'graph_breaks')} | {_cell(comp, 'regions_per_step')} | "
                     f"{loss} | {wall:.0f} s |")
    failed = [case for case, record, _ in rows if "error" in record["compiled"]]
    ran = [case for case, record, _ in rows if "error" not in record["compiled"]]
    lines += ["", f"Compiled and ran: {', '.join(f'dp_shard {d} x tp {t} {s}' for d, t, s in ran) or 'none'}. "
              f"Failed: {', '.join(f'dp_shard {d} x tp {t} {s}' for d, t, s in failed) or 'none'}. "
              + _what_the_suite_builds(rows) + " A row with graph breaks ran partly eager."]
    return "\n".join(lines) + "\n"


def _what_the_suite_builds(rows: list[tuple[tuple[int, int, str], dict, float]]) -> str:
    """The config's tensor-parallel strategies beside what ran compiled under tensor parallel here; a strategy the
    config accepts that failed here (or one that ran but is refused) is named, not hidden."""
    from pytest_flashckpt.core import registry

    accepted = set(registry.tensor_parallel_compiled_strategies())
    inside = [row for row in rows if ":" not in row[0][2]]  # the suite's order: the checkpoint inside the compiled block
    tp_ran = {s for (_, t, s), record, _ in inside if t > 1 and "error" not in record["compiled"]}
    tp_tried = {s for (_, t, s), _, _ in inside if t > 1}
    text = (f"What the suite builds from this: compiled FSDP2 ranks, and compiled tensor-parallel ranks with "
            f"{', '.join(sorted(accepted))} (`core.registry.tensor_parallel_compiled_strategies`) with the "
            "checkpoint inside the compiled block; the other strategies are refused there before anything runs, "
            "naming this report.")
    if accepted & tp_tried - tp_ran or (tp_ran - accepted):
        text += (f" **Disagrees with this run**: accepted but failed here: {sorted(accepted & tp_tried - tp_ran)}; "
                 f"ran here but refused: {sorted(tp_ran - accepted)}.")
    outside = [row for row in rows if ":" in row[0][2]]
    if outside:
        def named(ok: bool) -> str:
            return ", ".join(f"dp_shard {d} x tp {t} {s.split(':')[0]}" for (d, t, s), record, _ in outside
                             if ("error" not in record["compiled"]) == ok) or "none"
        built = set(registry.whole_block_strategies())
        failed = {s.split(":")[0] for (_, _, s), record, _ in outside if "error" in record["compiled"]}
        text += (f" With the checkpoint outside the compiled block: ran {named(True)}; failed {named(False)}; the "
                 f"suite builds it for {', '.join(sorted(built))} (`compile.ac_wrapper: outside`, "
                 "`core.registry.whole_block_strategies`), under tensor parallel too.")
        if built & failed:
            text += f" **Disagrees with this run**: built but failed here: {sorted(built & failed)}."
    return text


def main() -> None:
    print_only = print_only_flag(__doc__)
    rows = []
    for dp, tp, strategy in CASES:
        record, wall = run_case(dp, tp, strategy)
        rows.append(((dp, tp, strategy), record, wall))
        print(f"dp {dp} tp {tp} {strategy}: {'error' if 'error' in record['compiled'] else 'ok'} in {wall:.0f} s", file=sys.stderr)
    command = "python benchmarks/spike_compiled_layouts.py" + (" --print" if print_only else "")
    write_or_print(render(rows, command), ROOT / "reports" / "spike-compiled-layouts.md", print_only=print_only)


if __name__ == "__main__":
    main()
