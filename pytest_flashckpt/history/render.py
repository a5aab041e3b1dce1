"""The history as markdown (a pull-request comment or a dashboard page) and trend plots (PNG, change points
marked): a table of every change point found, where the runs' profile changed, what was left out, then one plot
per metric with a change, each scenario's series drawn relative to its first run so series of different scales
share an axis.

Every text that comes from a result file (scenario ids, commits, times, profile ids and fields, file paths, the
reasons a file was skipped) is escaped (``plain``): a downloaded artifact could otherwise put a link, an image, an
HTML tag or a table break into a page a pull request shows."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Sequence

from pytest_flashckpt.core.files import atomic_write_text
from pytest_flashckpt.history.changes import ChangePoint
from pytest_flashckpt.history.series import History, Run, Series

MAX_SERIES_PER_PLOT = 12  # past a dozen lines a plot is unreadable; the table still lists every change
MAX_LISTED = 20  # skipped files / dropped values listed in the markdown; the rest are counted

_INLINE_SPECIAL = re.compile(r"([\\`*_{}\[\]()!|~])")  # what can start a link, emphasis, code, a table cell
_LINE_START = re.compile(r"^(\s*|\s*\d+(?=[.)]))([#+\-=>]|(?<=\d)[.)])")  # what makes a heading, a list, a quote at a line's start


def plain(text: object) -> str:
    """``text`` as literal text in markdown and in the HTML a markdown renderer makes of it: HTML escaped, the
    markdown punctuation that acts anywhere backslash-escaped (CommonMark allows it before any ASCII punctuation),
    a leading heading / list / quote mark escaped, autolinks (``https://``, ``www.``) broken, line breaks as
    spaces. Dots and dashes inside a text stay as they are, so ``cpu-2t-torch2.13.0`` reads as itself."""
    text = re.sub(r"[\r\n\t\x00-\x1f\x7f]+", " ", html.escape(str(text), quote=True))
    text = _INLINE_SPECIAL.sub(r"\\\1", text)
    text = text.replace("://", ":\\/\\/").replace("www.", "www\\.")
    return _LINE_START.sub(lambda m: m.group(1) + "\\" + m.group(2), text)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.") or "metric"


def plot_metric(metric: str, found: Sequence[tuple[Series, list[ChangePoint]]], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.5, 4.6), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for series, points in found[:MAX_SERIES_PER_PLOT]:
        first = series.values[0] or 1.0
        rel = [v / first for v in series.values]
        # a scenario id is drawn as text, never parsed as mathtext ($...$ in a hostile id)
        (line,) = ax.plot(range(len(rel)), rel, marker=".", linewidth=1, label=series.scenario.replace("$", r"\$"))
        for segment in series.segments()[1:]:
            ax.axvline(segment.start - 0.5, color="grey", linestyle="-", linewidth=2, alpha=0.5)
        for cp in points:
            ax.axvline(cp.index - 0.5, color=line.get_color(), linestyle="--", linewidth=1)
            ax.annotate(f"{cp.change:+.1%}", (cp.index, rel[cp.index]), textcoords="offset points", xytext=(3, 6),
                        fontsize=7, color=line.get_color())
    ax.set_xlabel("run (oldest first, by recorded time); solid grey: the profile (machine) changed")
    ax.set_ylabel(f"{metric} / first run's")
    ax.set_title(f"{metric}: change points (dashed) found by e-divisive (Apache Otava)")
    ax.legend(fontsize=7, loc="best")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fig.savefig(fh, format="png")


def _what_changed(before: Run, after: Run) -> str:
    a, b = dict(before.profile), dict(after.profile)
    differ = [f"{k}: {a.get(k, '-')} → {b.get(k, '-')}" for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]
    return "; ".join(differ) or "the profile fields are not recorded"


def profile_changes(history: History) -> list[str]:
    """One markdown table row per run whose profile differs from the run before it."""
    runs = [run for run, _ in history.runs]
    rows = []
    for i in range(1, len(runs)):
        if runs[i].profile_id != runs[i - 1].profile_id:
            rows.append(f"| {i + 1} ({plain(runs[i].created)}) | {plain(runs[i - 1].profile_id)} | "
                        f"{plain(runs[i].profile_id)} | {plain(_what_changed(runs[i - 1], runs[i]))} |")
    return rows


def _listed(title: str, lines: Sequence[str]) -> list[str]:
    if not lines:
        return []
    more = [f"- ... and {len(lines) - MAX_LISTED} more"] if len(lines) > MAX_LISTED else []
    return ["", f"**{title}** ({len(lines)}):", "", *(f"- {plain(line)}" for line in lines[:MAX_LISTED]), *more]


def markdown(found: Sequence[tuple[Series, list[ChangePoint]]], history: History, folder: str, command: str,
             max_pvalue: float, min_magnitude: float, plots: dict[str, str]) -> str:
    changed = [(s, cps) for s, cps in found if cps]
    changes = profile_changes(history)
    lines = [
        "# Change points over the run history",
        "",
        f"{len(history.runs)} runs from {plain(folder)}, ordered by their recorded time; {len(found)} series (scenario x "
        f"metric); {sum(len(c) for _, c in changed)} change points in {len(changed)} series (e-divisive, Apache Otava, "
        f"p < {max_pvalue}{f', |change| >= {min_magnitude:.0%}' if min_magnitude else ''}"
        f"{'; within each profile segment' if changes else ''}).  ",
        f"Command: {plain(command)}",
        "",
    ]
    if changed:
        lines += ["| scenario | metric | at run | commit | before | after | change | p |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for series, cps in changed:
            for cp in cps:
                run = series.runs[cp.index]
                lines.append(f"| {plain(series.scenario)} | {plain(series.metric)} | {cp.index + 1} ({plain(run.created)}) | "
                             f"{plain((run.commit or '?')[:12])} | {cp.before:.4g} | {cp.after:.4g} | {cp.change:+.1%} | {cp.p_value:.2g} |")
    else:
        lines.append("_No change point in any series._")
    if changes:
        lines += ["", f"**The profile changed {len(changes)} time(s)** (another machine or software): each change starts "
                  "a new segment of every series, change points are found within a segment only, never across a "
                  "profile change.", "",
                  "| from run | profile before | profile after | what differs |", "| --- | --- | --- | --- |", *changes]
    lines += _listed("Files skipped", history.skipped)
    lines += _listed("Values dropped", history.dropped)
    for metric, file in plots.items():
        lines += ["", f"![{plain(metric)}]({file})"]
    lines.append("")
    return "\n".join(lines)


def write(found: Sequence[tuple[Series, list[ChangePoint]]], history: History, folder: str, command: str, out: Path,
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
    atomic_write_text(path, markdown(found, history, folder, command, max_pvalue, min_magnitude, plots))
    return path
