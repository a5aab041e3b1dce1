"""The centre of the report: the article's scenario table with measured columns beside the claimed ones, and its
single gradient-checkpointing claim beside our number."""

from __future__ import annotations

from dataclasses import dataclass
import statistics

from pytest_flashckpt.core.claims import GRADIENT_CHECKPOINTING, MIN_WORKLOADS, OVERHEAD_BANDS, SAVING_TOLERANCE, TABLE, Claim
from pytest_flashckpt.report import select
from pytest_flashckpt.report.format import MISSING, ms, pct, ratio, spread
from pytest_flashckpt.report.tables import escape, table
from pytest_flashckpt.report.claim_verdicts import judge, judge_row
from pytest_flashckpt.core.result import Result, RunRecord

HEADERS = [
    "scenario", "strategy", "configuration measured", "workloads", "claimed memory saving", "measured memory saving",
    "claimed overhead", "measured overhead", "save criterion", "measured save", "verdict",
]
DETAIL_HEADERS = ["claim", "measured by", "memory saving", "overhead (min-max)", "save", "verdict"]


def _overhead(r: Result) -> str:
    return spread(r.number("overhead"), r.number("overhead_min"), r.number("overhead_max"))


def _stall(r: Result) -> str:
    if select.save_strategy(r) == "none":
        return "no save in this scenario"
    stall = r.number("save_stall_s")
    if stall is None:
        return MISSING
    share = r.number("stall_vs_sync")
    return f"{ms(stall)} ({pct(share)} of a sync save)" if share is not None else ms(stall)


def _save_measure(claim: Claim, r: Result) -> str:
    """The measured quantity behind the row's save criterion, for one workload."""
    kind = claim.save.kind if claim.save is not None else None
    if kind == "bytes" and r.number("bytes_vs_full") is not None:
        return f"{pct(r.number('bytes_vs_full'))} of a full save's bytes"
    if kind == "schedule" and r.number("deferrals") is not None:
        return f"{int(r.number('deferrals') or 0)} deferred, {int(r.number('forced_saves') or 0)} forced"
    return _stall(r)


def _range(results: list[Result], key: str, fmt) -> str:
    values = [float(v) for v in (r.number(key) for r in results if r.status == "measured") if v is not None]
    if not values:
        return "not measured"
    low, high = fmt(min(values)), fmt(max(values))
    return low if low == high else f"{low}-{high}"  # values that differ below the shown precision read as one


def _workloads(results: list[Result]) -> str:
    points = [f"{select.card(r)} {r.config.batch_size}x{r.config.seq_len}" for r in results]
    return f"{len(points)}: " + ", ".join(points)


def _configurations(results: list[Result]) -> str:
    described = sorted({select.describe_strategies(r) for r in results})
    return "; ".join(described) if described else "nothing"


def _save_range(claim: Claim, results: list[Result]) -> str:
    kind = claim.save.kind if claim.save is not None else None
    if kind == "stall":
        return _range(results, "stall_vs_sync", lambda v: f"{v * 100:.0f}%") + " of a sync save"
    if kind == "bytes":
        return _range(results, "bytes_vs_full", lambda v: f"{v * 100:.0f}%") + " of a full save's bytes"
    if kind == "schedule":
        return _range(results, "deferrals", lambda v: f"{v:.0f}") + " deferrals, " + _range(results, "forced_saves", lambda v: f"{v:.0f}") + " forced"
    return MISSING


def _row(claim: Claim, results: list[Result]) -> list[str]:
    if not results:
        verdict = judge(claim, None).cell()
        return [
            claim.title, claim.strategy, "nothing", "0", claim.describe_saving(), "not measured",
            claim.describe_overhead(), "not measured", claim.save.text if claim.save else MISSING, "not measured", escape(verdict),
        ]
    row = judge_row(claim, results)
    return [
        claim.title, claim.strategy, escape(_configurations(results)), _workloads(results), claim.describe_saving(),
        _range(results, "memory_saving", lambda v: f"{v * 100:.1f}%"), claim.describe_overhead(),
        _range(results, "overhead", lambda v: f"{v:.2f}x"), claim.save.text if claim.save else MISSING,
        _save_range(claim, results), escape(row.cell()),
    ]


@dataclass(frozen=True)
class ArticleRow:
    """One claim of the article's table over the workloads that tested it (``result``: the first of them, None when
    nothing did), with its verdict and measured ranges. The terminal summary (``report.terminal``) renders these;
    the markdown table (``article_table``) shows the same verdicts with more columns."""

    claim: Claim
    result: Result | None
    verdict: object  # claim_verdicts.RowVerdict (or Verdict when nothing tested the claim): .word, .cell()
    measured_saving: str
    measured_overhead: str
    measured_stall: str


def article_rows(record: RunRecord) -> list[ArticleRow]:
    """Every claim of the article's table, judged over all the results tagged with it."""
    tagged = select.by_article(record.results)
    rows = []
    for claim in TABLE:
        results = tagged.get(claim.id, [])
        if not results:
            rows.append(ArticleRow(claim, None, judge(claim, None), "not measured", "not measured", "not measured"))
            continue
        rows.append(ArticleRow(
            claim, results[0], judge_row(claim, results),
            _range(results, "memory_saving", lambda v: f"{v * 100:.1f}%"),
            _range(results, "overhead", lambda v: f"{v:.2f}x"), _save_range(claim, results),
        ))
    return rows


def _detail(claim: Claim, r: Result) -> list[str]:
    verdict = judge(claim, r)
    if r.status != "measured":
        return [claim.title, f"`{r.id}`", "not measured", "not measured", "not measured", escape(verdict.cell())]
    saving = r.number("memory_saving")
    return [
        claim.title, f"`{r.id}` ({select.card(r)} {r.config.batch_size}x{r.config.seq_len})",
        pct(saving) if saving is not None else MISSING, _overhead(r), _save_measure(claim, r), escape(verdict.cell()),
    ]


def measured_here(record: RunRecord) -> str:
    """What each activation strategy cost in this run (the numbers beside the published ones, never typed in)."""
    by_strategy: dict[str, list[float]] = {}
    for r in select.activation_results(record.results):
        value = r.number("overhead")
        if r.status == "measured" and value is not None:
            by_strategy.setdefault(select.describe_activation(r), []).append(float(value))
    if not by_strategy:
        return ""
    parts = [
        f"{name} {min(v):.2f}x" + (f"-{max(v):.2f}x" if max(v) != min(v) else "") + f" ({len(v)} scenario{'s' if len(v) > 1 else ''})"
        for name, v in sorted(by_strategy.items(), key=lambda kv: statistics.median(kv[1]))
    ]
    return "Measured in this run (median overhead per scenario, range over scenarios): " + "; ".join(parts) + "."


def definitions(record: RunRecord | None = None) -> list[str]:
    bands = "; ".join(f"**{b.label}** {b.describe()} ({b.why})" for b in OVERHEAD_BANDS.values())
    saves = "; ".join(f"**{c.title}**: {c.save.text} ({c.save.why})" for c in TABLE if c.save is not None)
    here = measured_here(record) if record is not None else ""
    return [
        f"How to read the verdicts: each row is one configuration measured over at least {MIN_WORKLOADS} workloads, and "
        f"its verdict counts the workloads where the claim holds, with the measured ranges. On one workload a claim "
        f"holds when every part holds: the measured saving (1 - peak / reference peak) is within "
        f"±{SAVING_TOLERANCE * 100:.0f} percentage points of the claim; the overhead (strategy step time / reference "
        f"step time, per interleaved round; the training step only, a save's cost is the save column) lies in the "
        f"claimed band over all its rounds (all rounds outside: does not hold; rounds on both sides of a band edge: not "
        f"measurable); and the save meets the row's criterion. The overhead words mean: {bands}. The save criteria: "
        f"{saves}.",
        *([""] + [here] if here else []),
    ]


def article_table(record: RunRecord) -> list[str]:
    tagged = select.by_article(record.results)
    rows = [_row(claim, tagged.get(claim.id, [])) for claim in TABLE]
    details = [_detail(claim, r) for claim in TABLE for r in tagged.get(claim.id, [])]
    known = {c.id for c in TABLE} | {GRADIENT_CHECKPOINTING.id}
    unknown = sorted(tag for tag in tagged if tag not in known)
    warning = [
        "",
        f"Scenarios name article claims that do not exist: {', '.join(f'`{t}`' for t in unknown)} "
        f"(known: {', '.join(f'`{k}`' for k in sorted(known))}); they are not in the table.",
    ] if unknown else []
    return [
        "## The article's scenario table, measured",
        "",
        "Claims from the seed article's table (场景 / 推荐策略 / 显存节省 / 性能开销), each tested by the scenarios "
        "whose suite entry sets `article:` to the claim's id (`prototype`, `medium`, `large`): both halves of each "
        "row, the activation strategy and the save strategy, measured and judged.",
        "",
        table(rows, HEADERS),
        *warning,
        "",
        *(["Per workload:", "", table(details, DETAIL_HEADERS), ""] if details else []),
        *definitions(record),
    ]


def single_claim(record: RunRecord) -> list[str]:
    claim = GRADIENT_CHECKPOINTING
    results = select.by_article(record.results).get(claim.id, [])
    lines = [
        "## The article's single claim: gradient checkpointing",
        "",
        f"> {claim.quote}",
        f"> ({claim.summary})",
        "",
    ]
    if not results:
        lines.append(f"_Not measurable: no scenario with `article: {claim.id}` ran in this suite._")
        return lines
    rows = []
    for r in results:
        verdict = judge(claim, r)
        if r.status != "measured":
            rows.append([f"`{r.id}`", "not measured", "not measured", MISSING, escape(verdict.cell())])
            continue
        flops, saving = r.number("flop_ratio"), r.number("memory_saving")
        rows.append([
            f"`{r.id}` ({select.describe_activation(r)}, seq {r.config.seq_len})",
            pct(saving) if saving is not None else MISSING,
            _overhead(r),
            ratio(flops) if flops is not None else MISSING,
            escape(verdict.cell()),
        ])
    lines += [
        table(rows, [
            "measured by", f"memory saving (claimed {claim.describe_saving()})",
            f"overhead (claimed {claim.describe_overhead()})", "FLOP ratio", "verdict",
        ]),
        "",
        "For scale: recomputing every block costs one extra forward pass, about +33% FLOPs (FLOP ratio ~1.33x); "
        "Korthikanti et al. (2022) measured 36-39% more time for it at scale. A wall-time overhead well under the "
        "FLOP ratio means the step is not compute-bound (memory traffic, optimizer, launch overheads).",
    ]
    return lines
