"""The report's plots, PNGs beside the markdown: memory saving vs overhead (the Pareto view, with the article's
claims drawn as target boxes), peak memory vs sequence length per attention backend, save stall vs total per
save strategy, MFU (filled) and HFU (hollow) vs peak memory per activation strategy.

matplotlib is imported only when a plot is drawn, and through its object API (``Figure`` + the Agg canvas), so
importing the plugin stays cheap and no global pyplot backend is switched under a user's feet. A plot whose
data is absent is not drawn; ``Plot.reason`` says why and the report prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from pytest_flashckpt.core.claims import CLAIMS
from pytest_flashckpt.core.files import atomic_write
from pytest_flashckpt.report import select
from pytest_flashckpt.core.result import Result, RunRecord

if TYPE_CHECKING:
    from matplotlib.axes import Axes

PARETO = "flashckpt-pareto.png"
ATTENTION = "flashckpt-attention-memory.png"
SAVES = "flashckpt-save-stall.png"
THROUGHPUT = "flashckpt-mfu-memory.png"


@dataclass(frozen=True)
class Plot:
    """A plot drawn (``file``, relative to the report) or skipped (``reason``)."""

    key: str
    title: str
    file: str | None = None
    reason: str | None = None

    def markdown(self) -> str:
        if self.file is not None:
            return f"![{self.title}]({self.file})"
        return f"_Plot \"{self.title}\" not drawn: {self.reason}._"


def _save(draw: Callable[["Axes"], None], path: Path, size: tuple[float, float] = (7.5, 4.8)) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    draw(fig.add_subplot())
    with atomic_write(path) as fh:
        fig.savefig(fh, format="png")


# -- memory saving vs overhead -----------------------------------------------------------------------------
def pareto_points(results: list[Result]) -> list[Result]:
    return [
        r for r in select.activation_results(results)
        if r.status == "measured" and r.number("memory_saving") is not None and r.number("overhead") is not None
    ]


def _frontier(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Non-dominated (overhead, saving) points: nothing else is both cheaper and saves more."""
    best: list[tuple[float, float]] = []
    for x, y in sorted(points):
        if not best or y > best[-1][1]:
            best.append((x, y))
    return best


CLAIM_COLORS = {"prototype": "tab:green", "medium": "tab:orange", "large": "tab:red", "gradient_checkpointing": "tab:purple"}
KERNEL_PALETTE = ["tab:blue", "tab:orange", "tab:cyan", "tab:brown", "tab:pink"]
STRATEGY_MARKERS = ["o", "^", "D", "v", "P", "X", "*"]


def draw_pareto(results: list[Result], path: Path) -> None:
    """Memory saved against time paid per activation strategy, over the article's claim bands, with the measured
    Pareto front (``activation`` section's plot)."""
    chosen = pareto_points(results)

    def draw(ax: "Axes") -> None:
        left, right = _overhead_limits(chosen)
        _draw_claim_bands(ax, left, right)
        kernel_color, strategy_marker = _pareto_styles(chosen)
        to_label, repeats = _draw_pareto_points(ax, chosen, kernel_color, strategy_marker)
        _draw_pareto_legend(ax, kernel_color, strategy_marker, repeats)
        _draw_front(ax, chosen)
        ax.set_xlim(left, right)
        ax.set_ylim(-5, 90)
        ax.set_xlabel("overhead: step time / reference step time (median, min-max bars)")
        ax.set_ylabel("memory saving: 1 - peak / reference peak (%)")
        ax.set_title("Activation strategies: memory saved vs time paid")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        _place_labels(ax, to_label)  # last: it measures text against the final limits and layout

    _save(draw, path, (11.5, 6.0))


def _overhead_limits(chosen: list[Result]) -> tuple[float, float]:
    """The x range: every point and its min-max bar, at least 0.95-1.5 (noise can dip below 1)."""
    xs = [r.number("overhead") or 1.0 for r in chosen]
    right = max([*xs, *(r.number("overhead_max") or 1.0 for r in chosen), 1.5]) + 0.1
    left = min([*xs, *(r.number("overhead_min") or 1.0 for r in chosen), 0.95]) - 0.05
    return left, right


def _draw_claim_bands(ax: "Axes", left: float, right: float) -> None:
    """Each article claim as a shaded box: its saving +- tolerance over its overhead band."""
    for claim in CLAIMS.values():
        band = claim.overhead
        x0, x1 = max(band.low, left), band.high if band.high is not None else right
        y0, y1 = (claim.saving - claim.saving_tolerance) * 100, (claim.saving + claim.saving_tolerance) * 100
        ax.fill_between([x0, x1], y0, y1, alpha=0.12, color=CLAIM_COLORS.get(claim.id, "grey"), linewidth=0,
                        label=f"article: {claim.title} ({claim.describe_saving()}, {claim.overhead_text})")


def _pareto_styles(chosen: list[Result]) -> tuple[dict[str, str], dict[str, str]]:
    """Colour per kernel (eager first), marker shape per activation strategy."""
    kernels = sorted({r.kernel or "?" for r in chosen}, key=lambda k: (k != "eager", k))
    strategies = list(dict.fromkeys(select.describe_activation(r) for r in chosen))
    return ({k: KERNEL_PALETTE[i % len(KERNEL_PALETTE)] for i, k in enumerate(kernels)},
            {s: STRATEGY_MARKERS[i % len(STRATEGY_MARKERS)] for i, s in enumerate(strategies)})


def _pareto_identity(r: Result) -> tuple[str, object, str, str]:
    return (select.describe_activation(r), r.config.seq_len, r.kernel or "?", select.save_strategy(r))


def _draw_pareto_points(ax: "Axes", chosen: list[Result], kernel_color: dict[str, str],
                        strategy_marker: dict[str, str]) -> tuple[list[tuple[float, float, str]], list[str]]:
    """Each result with its min-max bar; returns the labels to place and the scenarios drawn as repeats.

    A run whose (strategy, seq, kernel, save) another run already shows (the article scenarios re-run a matrix
    configuration) is drawn hollow and not labelled again: its label would overprint the first one."""
    several_seqs = len({r.config.seq_len for r in chosen}) > 1
    seen: set[tuple[str, object, str, str]] = set()
    to_label: list[tuple[float, float, str]] = []
    repeats: list[str] = []
    for r in chosen:
        x, y = r.number("overhead") or 1.0, (r.number("memory_saving") or 0.0) * 100
        lo, hi = r.number("overhead_min") or x, r.number("overhead_max") or x
        strategy, seq, kernel, save = identity = _pareto_identity(r)
        color = kernel_color[kernel]
        repeat = identity in seen
        seen.add(identity)
        ax.errorbar([x], [y], xerr=[[x - lo], [hi - x]], fmt=strategy_marker[strategy], color=color, capsize=3,
                    markersize=7, alpha=0.45 if repeat else 1.0, markerfacecolor="white" if repeat else color,
                    elinewidth=1)
        if repeat:
            repeats.append(r.scenario)
            continue
        label = strategy.replace(" (k=", " k=").replace(")", "")
        if save != "none":
            label += f"+{save}"
        if several_seqs:
            label += f" {seq}"
        to_label.append((x, y, label))
    return to_label, repeats


def _draw_pareto_legend(ax: "Axes", kernel_color: dict[str, str], strategy_marker: dict[str, str], repeats: list[str]) -> None:
    """Legend entries: kernel = colour, strategy = marker shape, and the repeats named."""
    for k, color in kernel_color.items():
        ax.plot([], [], "s", color=color, label=f"kernel: {k}")
    for s_name, marker in strategy_marker.items():
        ax.plot([], [], marker, color="dimgray", label=f"strategy: {s_name}")
    if repeats:
        ax.plot([], [], "o", color="dimgray", markerfacecolor="white", alpha=0.6,
                label="same config re-run: " + ", ".join(repeats))


def _draw_front(ax: "Axes", chosen: list[Result]) -> None:
    """The measured Pareto front from the reference point (1, 0), and the reference itself."""
    front = _frontier([(r.number("overhead") or 1.0, (r.number("memory_saving") or 0.0) * 100) for r in chosen])
    ax.plot([1.0, *(p[0] for p in front)], [0.0, *(p[1] for p in front)], "--", color="tab:blue", alpha=0.5,
            label="measured Pareto front (from the reference)")
    ax.plot([1.0], [0.0], "s", color="black", label="reference (no checkpointing)")


def _place_labels(ax: "Axes", points: list[tuple[float, float, str]]) -> None:
    """Annotate each point, trying offsets around it until the text box hits no earlier label nor marker."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    fig.draw_without_rendering()  # settle the layout (limits, constrained layout) before measuring
    pixels = [ax.transData.transform((x, y)) for x, y, _ in points]
    markers = [(px - 5, py - 5, px + 5, py + 5) for px, py in pixels]
    taken: list[tuple[float, float, float, float]] = []
    candidates = [(6, 4, "left"), (6, -11, "left"), (-6, 4, "right"), (-6, -11, "right"), (6, 13, "left"),
                  (-6, 13, "right"), (6, -20, "left"), (-6, -20, "right"), (0, 22, "center"), (0, -29, "center")]

    def hits(box: tuple[float, float, float, float], others: list[tuple[float, float, float, float]]) -> bool:
        return any(box[0] < o[2] and o[0] < box[2] and box[1] < o[3] and o[1] < box[3] for o in others)

    for (x, y, text), (px, py) in sorted(zip(points, pixels), key=lambda item: (-item[0][1], item[0][0])):
        own = (px - 5, py - 5, px + 5, py + 5)
        others = [m for m in markers if m != own]
        chosen_note = None
        for dx, dy, ha in candidates:
            note = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=7.5, ha=ha)
            ext = note.get_window_extent(renderer)
            box = (ext.x0 - 1, ext.y0 - 1, ext.x1 + 1, ext.y1 + 1)
            if not hits(box, taken + others):
                chosen_note = (note, box)
                break
            note.remove()
        if chosen_note is None:  # nowhere free: fall back to the first spot, with a leader line
            note = ax.annotate(text, (x, y), textcoords="offset points", xytext=(10, 18), fontsize=7.5,
                               arrowprops={"arrowstyle": "-", "color": "grey", "lw": 0.6})
            ext = note.get_window_extent(renderer)
            chosen_note = (note, (ext.x0, ext.y0, ext.x1, ext.y1))
        taken.append(chosen_note[1])


# -- peak memory vs sequence length ------------------------------------------------------------------------
def draw_attention(results: list[Result], path: Path) -> None:
    points = select.attention_points(results)
    backends = select.attention_backends(points)
    cards = sorted({p.card for p in points})

    def draw(ax: "Axes") -> None:
        for card in cards:
            mine = [p for p in points if p.card == card]
            for backend in backends:
                xy = [(p.seq_len, p.peak(backend)) for p in mine if p.peak(backend) is not None]
                if not xy:
                    continue
                kernel = next(p.by_backend[backend].kernel for p in mine if p.peak(backend) is not None)
                name = f"{backend} ({kernel})" + (f", {card}" if len(cards) > 1 else "")
                ax.plot([x for x, _ in xy], [y / 2**20 for _, y in xy], "o-", label=name)  # type: ignore[operator]
            states = [(p.seq_len, p.by_backend[b].metrics.get("state_bytes")) for p in mine for b in backends
                      if p.peak(b) is not None and isinstance(p.by_backend[b].metrics.get("state_bytes"), int)]
            if states:
                state = states[0][1] / 2**20  # type: ignore[operator]
                ax.axhline(state, linestyle=":", color="grey",
                           label=f"state before the step (params, grads, optimizer){', ' + card if len(cards) > 1 else ''}")
        seqs = sorted({p.seq_len for p in points})
        ax.set_xscale("log", base=2)
        ax.set_xticks(seqs, [str(s) for s in seqs])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel("peak training-step memory (MiB)")
        ax.set_title("Peak memory vs sequence length per attention kernel")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)

    _save(draw, path)


# -- save stall vs total -----------------------------------------------------------------------------------
def save_points(results: list[Result]) -> list[Result]:
    return [r for r in select.checkpoint_results(results) if r.status == "measured" and r.number("save_total_s") is not None]


def draw_saves(results: list[Result], path: Path) -> None:
    chosen = save_points(results)

    def draw(ax: "Axes") -> None:
        labels = [f"{select.describe_save(r)}\n{r.scenario}" for r in chosen]
        ys = list(range(len(chosen)))
        totals = [(r.number("save_total_s") or 0.0) * 1000 for r in chosen]
        stalls = [(r.number("save_stall_s") or 0.0) * 1000 for r in chosen]
        ax.barh([y + 0.2 for y in ys], totals, height=0.4, color="tab:gray", label="total (until durable)")
        ax.barh([y - 0.2 for y in ys], stalls, height=0.4, color="tab:red", label="stall (training blocked)")
        refs = [(y, (r.number("reference_save_total_s") or 0.0) * 1000) for y, r in zip(ys, chosen) if r.number("reference_save_total_s")]
        if refs:
            ax.plot([x for _, x in refs], [y for y, _ in refs], "k|", markersize=16, markeredgewidth=2,
                    label="sync save of the reference (total)")
        ref_at = dict(refs)
        for y, stall, total in zip(ys, stalls, totals):
            if total:
                ax.annotate(f"stall = {stall / total * 100:.0f}% of total", (max(stall, total, ref_at.get(y, 0.0)), y), xytext=(4, -3),
                            textcoords="offset points", fontsize=8)
        ax.set_yticks(ys, labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("time per save (ms, median over saves)")
        ax.set_title("Checkpoint saves: time training is blocked vs time until durable")
        ax.grid(axis="x", alpha=0.3)
        ax.figure.legend(fontsize=8, loc="outside lower center", ncol=3)  # under the x label, no gap to guess
        ax.set_xlim(right=max([*totals, *stalls, *(x for _, x in refs), 1.0]) * 1.25)

    _save(draw, path, (7.5, 2.2 + 0.7 * len(chosen)))


# -- MFU vs peak memory -------------------------------------------------------------------------------------
def draw_throughput(results: list[Result], path: Path) -> None:
    from pytest_flashckpt.report.throughput import mfu_of, plotted

    chosen = plotted(results)
    against = {mfu_of(r)[2] for r in chosen}
    basis = against.pop() if len(against) == 1 else "datasheet peak or measured roofline"

    def draw(ax: "Axes") -> None:
        strategies = sorted({select.describe_activation(r) for r in chosen})
        workloads: dict[tuple, list[Result]] = {}
        for r in chosen:
            workloads.setdefault((select.card(r), r.config.seq_len, r.kernel, r.config.dtype), []).append(r)
        for group in workloads.values():  # one workload's strategies joined: the memory / MFU trade-off
            group = sorted(group, key=lambda r: r.number("peak_bytes") or 0.0)
            ax.plot([(r.number("peak_bytes") or 0.0) / 2**20 for r in group], [(mfu_of(r)[0] or 0.0) * 100 for r in group],
                    "-", color="lightgrey", zorder=1)
        for i, strategy in enumerate(strategies):
            mine = [r for r in chosen if select.describe_activation(r) == strategy]
            color = f"C{i % 10}"
            xs = [(r.number("peak_bytes") or 0.0) / 2**20 for r in mine]
            ax.scatter(xs, [(mfu_of(r)[0] or 0.0) * 100 for r in mine], color=color, label=f"{strategy}: MFU", zorder=3)
            hfu = [(x, mfu_of(r)[1]) for x, r in zip(xs, mine) if mfu_of(r)[1] is not None]
            if hfu:
                ax.scatter([x for x, _ in hfu], [h * 100 for _, h in hfu], facecolors="none", edgecolors=color,
                           label=f"{strategy}: HFU", zorder=2)
        for group in workloads.values():
            top = max(group, key=lambda r: mfu_of(r)[0] or 0.0)
            ax.annotate(f"{select.card(top)} s{top.config.seq_len}", ((top.number("peak_bytes") or 0.0) / 2**20,
                        (mfu_of(top)[0] or 0.0) * 100), xytext=(4, 4), textcoords="offset points", fontsize=7)
        ax.set_xlabel("peak training-step memory (MiB)")
        ax.set_ylabel(f"% of the {basis}")
        ax.set_ylim(bottom=0)
        ax.set_title("MFU (filled) and HFU (hollow) vs peak memory per activation strategy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)

    _save(draw, path)


# -- all of them ---------------------------------------------------------------------------------------------
def _throughput_points(results: list[Result]) -> list[Result]:
    from pytest_flashckpt.report.throughput import plotted

    return plotted(results)


def write_plots(record: RunRecord, out_dir: Path) -> dict[str, Plot]:
    """Draw every plot whose data exists into ``out_dir``; the rest come back with the reason."""
    results = record.results
    points = select.attention_points(results)
    plotted = [p for p in points if any(p.peak(b) is not None for b in p.by_backend)]
    specs = [
        ("pareto", "Memory saving vs overhead per activation strategy", PARETO, draw_pareto,
         None if pareto_points(results) else "no activation-checkpointing scenario measured both memory saving and overhead"),
        ("attention", "Peak memory vs sequence length per attention kernel", ATTENTION, draw_attention,
         None if plotted else "no reference-configuration scenario (no activation strategy, no save) measured peak memory"),
        ("saves", "Save stall vs total per save strategy", SAVES, draw_saves,
         None if save_points(results) else "no scenario with a save strategy was measured"),
        ("throughput", "MFU and HFU vs peak memory per activation strategy", THROUGHPUT, draw_throughput,
         None if _throughput_points(results) else "no timed scenario measured both its MFU (datasheet or roofline) and its peak memory"),
    ]
    out: dict[str, Plot] = {}
    for key, title, name, draw, missing in specs:
        path = out_dir / name
        if missing is not None:
            path.unlink(missing_ok=True)  # a stale PNG from an earlier run would contradict this report
            out[key] = Plot(key, title, reason=missing)
            continue
        draw(results, path)
        out[key] = Plot(key, title, file=name)
    return out
