"""The markdown report written by every suite run."""

from __future__ import annotations

from pathlib import Path

from tabulate import tabulate

from pytest_flashckpt.report.format import MISSING, mib, ms, pct, ratio
from pytest_flashckpt.result import Result, RunRecord

REPORT_NAME = "flashckpt-report.md"


def _scenario_row(r: Result) -> list[str]:
    m = r.metrics
    if r.status != "measured":
        return [r.id, r.config.get("attention", ""), MISSING, MISSING, MISSING, MISSING, f"{r.status}: {r.reason}"]
    spread = ""
    if m.get("overhead") is not None:
        spread = f"{ratio(m['overhead'])} ({m['overhead_min']:.2f}-{m['overhead_max']:.2f})"
    return [r.id, r.kernel or MISSING, mib(m.get("peak_bytes")), pct(m.get("memory_saving")), ms(m.get("step_time_s")), spread or MISSING, "measured"]


def _attention_table(results: list[Result]) -> str:
    """Peak memory per attention kernel and sequence length (reference scenarios only), with eager/flash ratio."""
    rows: dict[tuple[str, int], dict[str, Result]] = {}
    for r in results:
        if r.status != "measured" or r.config["activation"]["strategy"] != "none" or "peak_bytes" not in r.metrics:
            continue
        if r.config["checkpoint"]["strategy"] != "none":
            continue
        key = (r.config["model"]["card"], r.config["seq_len"])
        rows.setdefault(key, {})[r.backend or ""] = r
    table = []
    for (card, seq), by_backend in sorted(rows.items()):
        eager, sdpa = by_backend.get("eager"), by_backend.get("sdpa") or by_backend.get("flash_attn")
        if eager is None or sdpa is None:
            continue
        table.append([
            card, seq, mib(eager.metrics["peak_bytes"]), f"{mib(sdpa.metrics['peak_bytes'])} ({sdpa.kernel})",
            ratio(eager.metrics["peak_bytes"] / sdpa.metrics["peak_bytes"]),
            ms(eager.metrics.get("step_time_s")), ms(sdpa.metrics.get("step_time_s")),
        ])
    if not table:
        return "_No eager/flash pair was measured in this run._"
    return tabulate(
        table,
        headers=["model", "seq", "eager peak", "flash peak (kernel)", "eager / flash", "eager step", "flash step"],
        tablefmt="github",
    )


def render(record: RunRecord) -> str:
    p = record.profile
    lines = [
        "# pytest-flashckpt report",
        "",
        f"- suite: `{record.suite}`; device `{record.device}` ({p.get('device_name')}); memory probe `{record.probe}`",
        f"- profile `{record.profile_id}`: torch {p.get('torch')}, CUDA {p.get('cuda') or 'none'}, flash-attn {p.get('flash_attn') or 'not installed'}, {p.get('cpu_threads')} CPU threads",
        f"- run {record.created}, commit `{record.commit or 'unknown'}`, pytest-flashckpt {record.tool_version}",
        "",
        "## Attention kernels: peak training-step memory vs sequence length",
        "",
        _attention_table(record.results),
        "",
        "## All scenarios",
        "",
        tabulate(
            [_scenario_row(r) for r in record.results],
            headers=["scenario", "kernel", "peak memory", "memory saving", "step time", "overhead (min-max)", "status"],
            tablefmt="github",
        ),
        "",
    ]
    return "\n".join(lines)


def write_report(record: RunRecord, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / REPORT_NAME
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render(record), encoding="utf-8")
    tmp.replace(path)
    return path


def summary_lines(results: list[Result]) -> list[str]:
    """Short terminal summary: one line per scenario."""
    out = []
    for r in results:
        if r.status != "measured":
            out.append(f"{r.id}: {r.status} ({r.reason})")
            continue
        m = r.metrics
        parts = [f"kernel {r.kernel}"]
        if "peak_bytes" in m:
            parts.append(f"peak {mib(m['peak_bytes'])}")
        if m.get("memory_saving") is not None:
            parts.append(f"saving {pct(m['memory_saving'])}")
        if m.get("step_time_s") is not None:
            parts.append(f"step {ms(m['step_time_s'])}")
        if m.get("overhead") is not None:
            parts.append(f"overhead {ratio(m['overhead'])}")
        if m.get("save_stall_s") is not None:
            parts.append(f"stall {ms(m['save_stall_s'])}")
        out.append(f"{r.id}: " + ", ".join(parts))
    return out
