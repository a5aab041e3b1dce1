"""The report's header: what was measured, where, with what, how often. A reader decides from these lines whether
two reports can be compared at all (same profile, same probe, same kernel)."""

from __future__ import annotations

from collections import Counter

from pytest_flashckpt.core.registry import PROBES
from pytest_flashckpt.report.throughput import header_lines as throughput_header
from pytest_flashckpt.core.result import RunRecord


def kernels_line(record: RunRecord) -> str:
    """Which attention kernel really ran, per backend asked for: ``sdpa -> cpu_flash (4 scenarios)``."""
    counts = Counter((r.backend or "?", r.kernel or "?") for r in record.results if r.status == "measured")
    if not counts:
        return "no scenario was measured"
    return "; ".join(f"`{backend}` -> `{kernel}` ({n} scenario{'s' if n != 1 else ''})" for (backend, kernel), n in sorted(counts.items()))


def rounds_line(record: RunRecord) -> str:
    rounds = sorted({r.config.rounds for r in record.results if "timing" in r.config.measure})  # timed scenarios only
    if not rounds:
        return "unknown"
    if len(rounds) == 1:
        line = f"{rounds[0]} interleaved timing round{'s' if rounds[0] != 1 else ''} per scenario"
    else:
        line = f"{rounds[0]}-{rounds[-1]} interleaved timing rounds per scenario"
    confirmed = [r for r in record.results if r.metrics.get("confirmation_rounds")]
    if confirmed:  # runner/confirm.py: a first look that read slower than the baseline
        added = sorted({int(r.metrics["confirmation_rounds"]) for r in confirmed})  # type: ignore[arg-type]
        line += (f", and {'/'.join(map(str, added))} confirmation rounds in {len(confirmed)} scenario(s) whose first "
                 "rounds read slower than the baseline")
    return line


def duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{seconds:.1f} s"


def wall_time_text(seconds: float | None, cpu_seconds: float | None = None) -> str:
    """``, wall time 4 min 21 s, CPU time 3 min 2 s`` (the suite run start to finish), or nothing for a file that
    did not record them."""
    wall = "" if seconds is None else f", wall time {duration(seconds)}"
    cpu = "" if cpu_seconds is None else f", CPU time {duration(cpu_seconds)} (this process and its children)"
    return wall + cpu


def status_line(record: RunRecord) -> str:
    counts = Counter(r.status for r in record.results)
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no scenarios"


def header(record: RunRecord) -> list[str]:
    p = record.profile
    spec = PROBES.get(record.probe)
    probe = f"`{record.probe}`: {spec.description if spec else 'unknown probe'}"
    return [
        "# pytest-flashckpt report",
        "",
        *(["**INTERRUPTED**: this run was stopped before it finished (Ctrl-C or SIGTERM); it holds the scenarios that "
           "finished, and the baseline was not updated.", ""] if record.interrupted else []),
        f"- **suite** `{record.suite}`: {status_line(record)}",
        f"- **profile** `{record.profile_id}`: {p.get('device_name', '?')} x{p.get('device_count', 1)}, "
        f"{p.get('cpu_threads', '?')} CPU threads",
        f"- **versions**: torch {p.get('torch', '?')}, CUDA {p.get('cuda') or 'none'}, "
        f"flash-attn {p.get('flash_attn') or 'not installed'}, pytest-flashckpt {record.tool_version or '?'}",
        f"- **attention kernel that ran**: {kernels_line(record)}",
        f"- **memory probe** {probe}",
        f"- **timing**: {rounds_line(record)}; ratios are medians of per-round strategy / reference step times",
        *throughput_header(record),
        f"- **run** {record.created}, commit `{record.commit or 'unknown'}`{wall_time_text(record.wall_time_s, record.cpu_time_s)}",
        *(f"- **note**: {note}" for note in record.notes),
    ]
