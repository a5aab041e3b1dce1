"""Is ``flashckpt fit``'s time model right about order? Two checks, written to reports/fit-check.md.

    python benchmarks/fit_check.py                  # launches 4 gloo ranks (a few minutes), writes the report
    python benchmarks/fit_check.py --rounds 3 --print

1. **Measured CPU step times at world 4** (``benchmarks/fit_check_worker.py`` under torchrun, gloo, one thread per
   rank): a small Llama (8 query heads, so tp 4 divides them) at dp_shard 4, dp_shard 2 x tp 2 and tp 4, the same
   global batch, steps interleaved round by round. The time model (``fit.time_model``) is given this machine's
   rates, measured by the same ranks: the bf16 matmul FLOP/s of one rank's thread as the peak (at ``mfu`` 1) and
   the gloo all-gather bandwidth as every link. Reported: the model's order against the measured order, and each
   layout's predicted / measured step time, twice: at ``mfu`` 1 (the matmul rate as if the step were all matmuls)
   and at the ``mfu`` a user would set from a measured run (``flashckpt fit --mfu``): the compute the model
   predicts for one rank's unsharded step at dp_shard 4's local batch over that step's time, measured by every rank
   in the same rounds with no collective (apart from the three layouts it is used to rank).
2. **torchtitan's published runs** (pytorch/torchtitan ``docs/performance.md``, cited per row): the model's
   tokens/s per GPU at the default MFU assumption against torchtitan's measured ones, for the layouts and batches
   torchtitan ran.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from fit_check_worker import CARD, GLOBAL_BATCH, LAYOUTS, ONE_RANK, SEQ, STRATEGY  # noqa: E402  one definition of the workload
from report_output import write_or_print  # noqa: E402

from pytest_flashckpt.config.model_card import load_card  # noqa: E402
from pytest_flashckpt.distributed import launcher  # noqa: E402
from pytest_flashckpt.fit.assumptions import DEFAULT_MFU  # noqa: E402
from pytest_flashckpt.fit.candidates import Candidate  # noqa: E402
from pytest_flashckpt.fit.hardware import DEVICES, Device  # noqa: E402
from pytest_flashckpt.fit.time_model import StepTimeModel  # noqa: E402
from pytest_flashckpt.runner.profile import cpu_name  # noqa: E402

REPORT = ROOT / "reports" / "fit-check.md"
WORKER = ROOT / "benchmarks" / "fit_check_worker.py"
TORCHTITAN = "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md"
# (label, card, device, candidate, torchtitan tokens/s per GPU, what torchtitan ran that the model does not have)
PUBLISHED = (
    ("Llama 3 8B, 64 A100, FSDP 64, local batch 1, selective op AC", "llama3-8b", "a100-sxm",
     Candidate(64, 64, 1, 1, 1, "selective_op", "mixed"), 2973, "eager; 'Llama 3 performance numbers' table"),
    ("Llama 3 70B, 64 A100, FSDP 64, local batch 1, full AC", "llama3-70b", "a100-sxm",
     Candidate(64, 64, 1, 1, 1, "full", "mixed"), 331, "eager; same table (51.7% MFU)"),
    ("Llama 3.1 8B, 8 H100, FSDP 8, local batch 2, selective AC", "llama3-8b", "h100-sxm",
     Candidate(8, 8, 1, 2, 1, "selective_op", "mixed"), 5762, "eager, 500 W power limit; Table 1 'FSDP' row"),
    ("Llama 3.1 8B, 128 H100, FSDP 128, local batch 2, selective AC", "llama3-8b", "h100-sxm",
     Candidate(128, 128, 1, 2, 1, "selective_op", "mixed"), 5605, "eager, 500 W; Table 3 'FSDP' row"),
    ("Llama 3.1 70B, 256 H100, FSDP 32 x TP 8, local batch 16, full AC", "llama3-70b", "h100-sxm",
     Candidate(256, 32, 8, 16, 1, "full", "mixed"), 829, "torch.compile + Float8 (the model has neither); Table 4 '2D' row"),
)


def gloo_check(rounds: int) -> tuple[dict, list[dict]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        launcher.run(launcher.Launch(4, timeout_s=1800), str(WORKER), [str(out), str(rounds)], log_path=out / "launch.log")
        record = json.loads((out / "rank-0.json").read_text(encoding="utf-8"))
    card = load_card("llama-tiny", **CARD)
    rate, link = record["matmul_flops_per_s"], record["allgather_bytes_per_s"]
    hop = record["allgather_hop_latency_s"]
    cpu = Device("cpu-gloo", platform.processor() or "this CPU", rate, 64 * 2**30, 10e9, link, link, 4,
                 ("measured by benchmarks/fit_check_worker.py on the same ranks",), 0.0, hop, hop)
    model = StepTimeModel(card, SEQ, cpu, mfu=1.0)
    one_rank = Candidate(1, 1, 1, GLOBAL_BATCH // LAYOUTS[0][0], 1, STRATEGY, "pure")
    record["calibrated_mfu"] = model.step(one_rank).compute_s / record["median_step_s"][ONE_RANK]
    calibrated = StepTimeModel(card, SEQ, cpu, mfu=min(record["calibrated_mfu"], 1.0))
    rows = []
    for dp, tp in LAYOUTS:
        c = Candidate(4, dp, tp, GLOBAL_BATCH // dp, 1, STRATEGY, "pure")
        predicted, at_mfu = model.step(c), calibrated.step(c)
        rows.append({"layout": c.describe(), "measured_s": record["median_step_s"][f"{dp}x{tp}"],
                     "predicted_s": predicted.step_s, "compute_s": predicted.compute_s, "tp_s": predicted.tp_s,
                     "fsdp_exposed_s": predicted.fsdp_exposed_s, "calibrated_s": at_mfu.step_s,
                     "calibrated_compute_s": at_mfu.compute_s, "calibrated_fsdp_exposed_s": at_mfu.fsdp_exposed_s})
    return record, rows


def published_rows() -> list[dict]:
    rows = []
    for label, card_name, device, c, measured, note in PUBLISHED:
        t = StepTimeModel(load_card(card_name), 8192, DEVICES[device]).step(c)
        rows.append({"label": label, "device": device, "measured": measured, "predicted": t.tokens_per_s_per_gpu,
                     "mfu": t.mfu, "note": note})
    return rows


def _order(rows: list[dict], key: str) -> list[str]:
    return [r["layout"] for r in sorted(rows, key=lambda r: r[key])]


def render(record: dict, gloo: list[dict], published: list[dict], command: str) -> str:
    import torch

    measured, predicted = _order(gloo, "measured_s"), _order(gloo, "predicted_s")
    calibrated = _order(gloo, "calibrated_s")
    lines = [
        "# Does fit's time model rank layouts right? (issue 32 item 5)", "",
        f"Produced by `{command}` on {platform.node()} ({os.cpu_count()} cores of {cpu_name()}, shared by other jobs), torch "
        f"{torch.__version__}; load average (1 min) at the end: {os.getloadavg()[0]:.2f}.", "",
        "## 1. Measured gloo step times at world 4 against the model", "",
        f"A Llama card (`llama-tiny` with `{json.dumps(CARD)}`), bf16, global batch {GLOBAL_BATCH} x {SEQ} tokens, "
        f"strategy {STRATEGY}, {record['rounds']} rounds x {record['steps']} steps per layout, interleaved; median step "
        "time of rank 0. The model gets this machine's rates measured by the same ranks: "
        f"{record['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s bf16 matmul per rank (as the peak, mfu 1) and "
        f"{record['allgather_bytes_per_s'] / 1e6:.0f} MB/s per rank gloo all-gather of 8 MiB (as every link), "
        f"{record['allgather_hop_latency_s'] * 1e6:.0f} us per ring hop of a few-element all-gather (as every hop's "
        "latency).", "",
        f"The calibrated columns set mfu {record['calibrated_mfu']:.3f}: the model's compute for one rank's "
        f"unsharded step at local batch {GLOBAL_BATCH // LAYOUTS[0][0]} over that step's measured median, "
        f"{record['median_step_s'][ONE_RANK] * 1e3:.1f} ms (every rank at once, no collective, in the same rounds).", "",
        "| layout | measured step | predicted step (mfu 1) | predicted / measured | predicted compute / TP / FSDP exposed "
        "| predicted step (calibrated mfu) | calibrated / measured | calibrated compute / FSDP exposed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in gloo:
        lines.append(f"| {r['layout']} | {r['measured_s'] * 1e3:.1f} ms | {r['predicted_s'] * 1e3:.1f} ms | "
                     f"{r['predicted_s'] / r['measured_s']:.2f} | {r['compute_s'] * 1e3:.1f} / {r['tp_s'] * 1e3:.1f} / "
                     f"{r['fsdp_exposed_s'] * 1e3:.1f} ms | {r['calibrated_s'] * 1e3:.1f} ms | "
                     f"{r['calibrated_s'] / r['measured_s']:.2f} | {r['calibrated_compute_s'] * 1e3:.1f} / "
                     f"{r['calibrated_fsdp_exposed_s'] * 1e3:.1f} ms |")
    same = measured == predicted
    spans = {r["layout"]: (min(record["step_s"][k]), max(record["step_s"][k]))
             for r, k in zip(gloo, (f"{dp}x{tp}" for dp, tp in LAYOUTS))}
    overlapping = [f"{a} and {b}" for a, b in zip(measured, measured[1:]) if spans[a][1] >= spans[b][0]]
    ratios = [r["predicted_s"] / r["measured_s"] for r in gloo]
    calibrated_ratios = [r["calibrated_s"] / r["measured_s"] for r in gloo]
    lines += ["", f"Measured order (fastest first): {', '.join(measured)}. Model's order at mfu 1: "
              f"{', '.join(predicted)}: {'the same order' if same else 'not the same order'}. At the calibrated mfu: "
              f"{', '.join(calibrated)}: {'the same order' if calibrated == measured else 'not the same order'} "
              f"(calibrated / measured {min(calibrated_ratios):.2f} to {max(calibrated_ratios):.2f}). "
              + (f"The round-to-round ranges of {'; '.join(overlapping)} overlap: that part of the measured order is "
                 "within this machine's noise. " if overlapping else "No two layouts' round-to-round ranges overlap. ")
              + f"Predicted / measured at mfu 1: {min(ratios):.2f} to {max(ratios):.2f}: the matmul rate alone "
              "misses most of this CPU step (below); the calibrated mfu carries what one rank's own step measured, "
              "as `flashckpt fit --mfu` does.",
              "Per-round samples (s): `" + json.dumps(record["step_s"]) + "`.", "",
              "What the model leaves out on CPU: the step's non-matmul ops (norms, rotary, softmax, AdamW's per-tensor "
              "loop), Python and dispatcher overhead per op (large at this size: it scales with the number of ops, "
              "which tensor parallel raises), and the overlap of gloo's collectives (run on gloo's own thread) with compute.", "",
              "## 2. torchtitan's published throughputs against the model", "",
              f"Source: [pytorch/torchtitan docs/performance.md]({TORCHTITAN}) (seq 8192; H100 rows on 96 GB HBM2e "
              f"H100s at 500 W). The model at its default MFU assumption ({DEFAULT_MFU}), the device table's "
              "datasheet rates, mixed precision.", "",
              "| torchtitan run | device row | torchtitan tokens/s/GPU | model tokens/s/GPU | model / torchtitan | model MFU | note |",
              "|---|---|---|---|---|---|---|"]
    for r in published:
        lines.append(f"| {r['label']} | {r['device']} | {r['measured']:,} | {r['predicted']:,.0f} | "
                     f"{r['predicted'] / r['measured']:.2f} | {r['mfu']:.1%} | {r['note']} |")
    ratios = [r["predicted"] / r["measured"] for r in published]
    lines += ["", f"Model / torchtitan ranges {min(ratios):.2f} to {max(ratios):.2f}: the absolute level is the MFU "
              "assumption's (A100 runs reach more of the peak than the default assumes, the 500 W H100s less), so "
              "set `--mfu` from a measured run of your own; the ranking between layouts of one device is what the "
              "search uses.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--print", action="store_true")
    args = parser.parse_args()
    record, gloo = gloo_check(args.rounds)
    command = "python benchmarks/fit_check.py" + (f" --rounds {args.rounds}" if args.rounds != 5 else "")
    write_or_print(render(record, gloo, published_rows(), command), REPORT, print_only=args.print)


if __name__ == "__main__":
    main()
