"""The history as markdown (a pull-request comment or a dashboard page) and trend plots (PNG, change points
marked): a table of every change point found, then one plot per metric with a change, each scenario's series
drawn relative to its first run so series of different scales share an axis."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from pytest_flashckpt.history.changes import ChangePoint
from pytest_flashckpt.history.series import Series

MAX_SERIES_PER_PLOT = 12  # past a dozen lines a plot is unreadable; the table still lists every change


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


def plot_metric(metric: str, found: Sequence[tuple[Series, list[ChangePoint]]], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.5, 4.6), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for series, points in found[:MAX_SERIES_PER_PLOT]:
        first = series.values[0] or 1.0
        rel = [v / first for v in series.values]
        (line,) = ax.plot(range(len(rel)), rel, marker=".", linewidth=1, label=series.scenario)
        for cp in points:
            ax.axvline(cp.index - 0.5, color=line.get_color(), linestyle="--", linewidth=1)
            ax.annotate(f"{cp.change:+.1%}", (cp.index, rel[cp.index]), textcoords="offset points", xytext=(3, 6),
                        fontsize=7, color=line.get_color())
    ax.set_xlabel("run (oldest first, by recorded time)")
    ax.set_ylabel(f"{metric} / first run's")
    ax.set_title(f"{metric}: change points (dashed) found by e-divisive (Apache Otava)")
    ax.legend(fontsize=7, loc="best")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")


def markdown(found: Sequence[tuple[Series, list[ChangePoint]]], n_runs: int, folder: str, command: str,
             max_pvalue: float, min_magnitude: float, plots: dict[str, str]) -> str:
    changed = [(s, cps) for s, cps in found if cps]
    lines = [
        "# Change points over the run history",
        "",
        f"{n_runs} runs from `{folder}`, ordered by their recorded time; {len(found)} series (scenario x metric); "
        f"{sum(len(c) for _, c in changed)} change points in {len(changed)} series (e-divisive, Apache Otava, "
        f"p < {max_pvalue}{f', |change| >= {min_magnitude:.0%}' if min_magnitude else ''}).  ",
        f"Command: `{command}`",
        "",
    ]
    if changed:
        lines += ["| scenario | metric | at run | commit | before | after | change | p |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for series, cps in changed:
            for cp in cps:
                run = series.runs[cp.index]
                lines.append(f"| `{series.scenario}` | `{series.metric}` | {cp.index + 1} ({run.created}) | "
                             f"{(run.commit or '?')[:12]} | {cp.before:.4g} | {cp.after:.4g} | {cp.change:+.1%} | {cp.p_value:.2g} |")
    else:
        lines.append("_No change point in any series._")
    for metric, file in plots.items():
        lines += ["", f"![{metric}]({file})"]
    lines.append("")
    return "\n".join(lines)


def write(found: Sequence[tuple[Series, list[ChangePoint]]], n_runs: int, folder: str, command: str, out: Path,
          max_pvalue: float, min_magnitude: float, draw: bool = True) -> Path:
    """``out/history.md`` and one ``history-<metric>.png`` per metric with a change point; returns the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    plots: dict[str, str] = {}
    if draw:
        for metric in sorted({s.metric for s, cps in found if cps}):
            file = f"history-{_slug(metric)}.png"
            plot_metric(metric, [(s, cps) for s, cps in found if cps and s.metric == metric], out / file)
            plots[metric] = file
    path = out / "history.md"
    path.write_text(markdown(found, n_runs, folder, command, max_pvalue, min_magnitude, plots), encoding="utf-8")
    return path
