"""A benchmark script imported by a test: its measurement kept as a check (the spikes of issue 32), and the rule a
gloo rank's windows are held to against their simulated twin."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def import_benchmark(name: str):
    """``benchmarks/<name>.py`` as a module, imported with its folder first on ``sys.path`` (as when it runs: it
    imports ``report_output`` from there), the path restored after."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))


def twin_peak_is_exact(where, windows: list[dict], simulated: dict, keys: tuple[str, ...]) -> bool:
    """Assert a gloo rank's repeated ``windows`` against its simulated twin: every window start and the optimizer
    peak equal to the lowest repeat, to the byte; the forward+backward peak at or above the twin's by at most one
    collective's buffer (gloo's thread may hold a finished all-gather a moment longer, in every repeat on a loaded
    machine). Returns whether that peak is exact too (the callers ask it of at least 3 of 4 cases)."""
    assert "error" not in simulated, (where, simulated.get("error"))
    for key in keys:
        lowest = min(w[key] for w in windows)
        if key != "fwd_bwd_peak_bytes":
            assert simulated[key] == lowest, (where, key, simulated[key], lowest)
    lowest = min(w["fwd_bwd_peak_bytes"] for w in windows)
    collective = max(w["largest_allgather_bytes"] for w in windows)
    assert 0 <= lowest - simulated["fwd_bwd_peak_bytes"] <= collective, (where, lowest, simulated["fwd_bwd_peak_bytes"], collective)
    return lowest == simulated["fwd_bwd_peak_bytes"]
