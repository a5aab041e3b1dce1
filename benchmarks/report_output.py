"""Where a benchmark's report goes: printed (the script's ``--print`` or ``--only``: nothing written) or written to its
file under ``reports/`` and the file's path printed. A benchmark run as ``python benchmarks/<name>.py`` imports it as
``report_output`` (its own folder is first on ``sys.path``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def write_or_print(text: str, report: Path, *, print_only: bool) -> None:
    """Print ``text`` when ``print_only``; otherwise write it to ``report`` (UTF-8) and print that path."""
    if print_only:
        print(text)
    else:
        report.write_text(text, encoding="utf-8")
        print(report)


def print_only_flag(doc: str | None) -> bool:
    """The ``--print`` flag of a spike with no other options (its parser described by ``doc``'s first line)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--print", action="store_true", help="print the report instead of writing it")
    return parser.parse_args().print


def produced_by(script: str, load_before: float) -> str:
    """A report's provenance line: the command as run (``sys.argv``), this machine and its CPU model (hosts of one
    profile differ in speed: times are comparable only on one CPU), torch, and the load average (1 min) before the
    run and now (torch imported here for its version)."""
    import os
    import platform
    import sys

    import torch

    from pytest_flashckpt.runner.profile import cpu_name

    argv = " ".join(sys.argv[1:])
    return (f"Produced by `python benchmarks/{script}{(' ' + argv) if argv else ''}` on {platform.node()} "
            f"({os.cpu_count()} cores of {cpu_name()}, shared), torch {torch.__version__}; load average (1 min) before / after: "
            f"{load_before:.2f} / {os.getloadavg()[0]:.2f}.")


def byte_range(values: list[int]) -> str:
    """``1,234`` when every value is equal, else ``low-high`` (a window's bytes over the repeats of a spike)."""
    low, high = min(values), max(values)
    return f"{low:,}" if low == high else f"{low:,}-{high:,}"


TWIN_WINDOWS = ("fwd_bwd_start_bytes", "fwd_bwd_peak_bytes", "optimizer_start_bytes", "optimizer_peak_bytes")


def error_record(exc: BaseException) -> dict:
    """What a configuration failed with, in one line (recorded, not raised: the failure is the finding)."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    return {"error": f"{type(exc).__name__}: {first}"[:300]}


def twin_cells(record: dict, keys: tuple[str, ...] = TWIN_WINDOWS) -> tuple[bool | None, list[str]]:
    """A gloo rank's repeats (``record["windows"]``) against its simulated twin (``record["simulated"]``): whether
    every window of the twin equals the measured lowest repeat (None where the twin failed), and the row's cells:
    forward+backward start -> peak measured and simulated, the optimizer's, and the gap (``equal to the byte``, or
    simulated - measured per window that differs)."""
    ws, sim = record["windows"], record.get("simulated", {"error": "not simulated"})

    def measured(start: str, peak: str) -> str:
        return f"{byte_range([w[start] for w in ws])} -> {byte_range([w[peak] for w in ws])}"

    cells = [measured("fwd_bwd_start_bytes", "fwd_bwd_peak_bytes"), "error",
             measured("optimizer_start_bytes", "optimizer_peak_bytes"), "error", "error"]
    if "error" in sim:
        return None, cells
    low = {k: min(w[k] for w in ws) for k in keys}
    same = all(sim[k] == low[k] for k in keys)
    cells[1] = f"{sim['fwd_bwd_start_bytes']:,} -> {sim['fwd_bwd_peak_bytes']:,}"
    cells[3] = f"{sim['optimizer_start_bytes']:,} -> {sim['optimizer_peak_bytes']:,}"
    cells[4] = "equal to the byte" if same else ", ".join(
        f"{k.replace('_bytes', '')} {sim[k] - low[k]:+,} B" for k in keys if sim[k] != low[k])
    return same, cells


def one_process_step(card, batch: int, seq: int, seed: int) -> tuple[float, dict]:
    """One process, the whole batch and sequence (``make_batch``'s first): the loss and every gradient of the first
    step, what a layout's ranks are checked against."""
    import torch

    from pytest_flashckpt.models.cards import build_model
    from pytest_flashckpt.training import make_batch

    model = build_model(card, "sdpa", "cpu", torch.float32, seed=seed)
    x, y = make_batch(card.vocab_size, batch, seq, seed, 0)
    loss = model(x, y)
    loss.backward()
    return float(loss), {name: p.grad for name, p in model.named_parameters()}


def gradient_gaps(model, reference: dict) -> tuple[float, float]:
    """The largest absolute and relative (norm) difference of ``model``'s gradients (DTensor shards gathered) from
    ``reference``'s, by parameter name."""
    from torch.distributed.tensor import DTensor

    worst_abs, worst_rel = 0.0, 0.0
    for name, param in model.named_parameters():
        grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
        ref = reference[name]
        worst_abs = max(worst_abs, float((grad - ref).abs().max()))
        worst_rel = max(worst_rel, float((grad - ref).norm() / ref.norm().clamp_min(1e-30)))
    return worst_abs, worst_rel


def add_twins(pairs) -> None:
    """For each ``(measured record, simulate)`` of ``pairs``: ``record["simulated"] = simulate()``, or what it failed
    with (``error_record``); a record whose measurement failed is left as it is."""
    for record, simulate in pairs:
        if "error" in record:
            continue
        try:
            record["simulated"] = simulate()
        except Exception as exc:  # noqa: BLE001 (recorded: what a configuration fails with is the finding)
            record["simulated"] = error_record(exc)


SCENARIO_WINDOWS = ("state_bytes", "fwd_bwd_peak_bytes", "optimizer_peak_bytes")


def scenario_windows(record: dict) -> dict:
    """A simulated rank's record under the names a scenario's rank (``distributed.rank.measure``) records."""
    return {"state_bytes": record["fwd_bwd_start_bytes"], "fwd_bwd_peak_bytes": record["fwd_bwd_peak_bytes"],
            "optimizer_peak_bytes": record["optimizer_peak_bytes"]}


def with_scenario_twins(ranks: list[dict], cases, twin) -> list[dict]:
    """``ranks`` (a gloo spike's records, ``rank["cases"][case]``) with each case's ``twin(case, rank)`` added
    (``add_twins``)."""
    import functools

    add_twins((rank["cases"][case], functools.partial(twin, case, rank["rank"])) for case in cases for rank in ranks)
    return ranks


def scenario_twin_cells(record: dict) -> tuple[bool | None, str, list[str]]:
    """A scenario rank's one measured step against its twin (``record["simulated"]``): whether every window is
    equal (None where the twin failed), the gap (``equal to the byte``, or simulated - measured per window that
    differs) and the ``measured / simulated`` cell of each window."""
    sim = record.get("simulated", {"error": "not simulated"})
    if "error" in sim:
        return None, "error", ["error"] * len(SCENARIO_WINDOWS)
    same = all(sim[k] == record[k] for k in SCENARIO_WINDOWS)
    gap = "equal to the byte" if same else ", ".join(
        f"{k.replace('_bytes', '')} {sim[k] - record[k]:+,} B" for k in SCENARIO_WINDOWS if sim[k] != record[k])
    return same, gap, [f"{record[k]:,} / {sim[k]:,}" for k in SCENARIO_WINDOWS]


def report_text(lines: list[str], errors: list[str]) -> str:
    """A spike's report: its lines, then the cases that failed (each ``- case: `error```), if any."""
    return "\n".join([*lines, *(["", "Failed:", *errors] if errors else [])]) + "\n"


def gloo_spike_ranks(script: str, world: int, timeout_s: float = 900.0) -> list[dict]:
    """One torchrun launch of ``script --gloo OUT`` on ``world`` gloo ranks (``distributed.launcher``); each rank
    writes ``OUT/rank-<r>.json``, returned in rank order."""
    import json
    import tempfile

    from pytest_flashckpt.distributed import launcher

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        launcher.run(launcher.Launch(world, timeout_s=timeout_s), str(Path(script).resolve()), ["--gloo", str(out)],
                     log_path=out / "launch.log")
        return [json.loads((out / f"rank-{r}.json").read_text(encoding="utf-8")) for r in range(world)]


def gloo_spike_main(doc: str | None, script: str, gloo_rank, measure, render) -> None:
    """A gloo spike's entry point: ``script --gloo OUT`` runs one rank (``gloo_rank(OUT)``); otherwise
    ``measure()`` returns the ranks' records, ``render(records, provenance)`` the report, written to
    ``reports/<script name with dashes>.md`` with the records beside it as ``.json`` (``--print``: printed only)."""
    import json
    import os
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "--gloo":
        gloo_rank(Path(sys.argv[2]))
        return
    print_only = print_only_flag(doc)
    load = os.getloadavg()[0]
    records = measure()
    name = Path(script).name
    report = Path(script).resolve().parents[1] / "reports" / f"{Path(script).stem.replace('_', '-')}.md"
    write_or_print(render(records, produced_by(name, load)), report, print_only=print_only)
    if not print_only:
        report.with_suffix(".json").write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")


def gloo_rank_records(out: Path, field: str, runs: dict) -> None:
    """One gloo rank of a spike: the process group started, each ``runs[key]()`` recorded under ``field`` (or the
    error it raised, one line: what a configuration fails with is the finding), a barrier after each, the record
    written to ``out/rank-<r>.json``."""
    import json

    import torch.distributed as dist

    from pytest_flashckpt.distributed import fsdp

    fsdp.init(timeout_s=300)
    record: dict = {"rank": dist.get_rank(), field: {}}
    for key, run in runs.items():
        try:
            record[field][key] = run()
        except Exception as exc:  # noqa: BLE001 (recorded, not raised)
            record[field][key] = error_record(exc)
        dist.barrier()
    (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(record), encoding="utf-8")
    dist.destroy_process_group()
