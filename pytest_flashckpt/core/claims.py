"""The article's claims as data: what it says (quoted), what it means in numbers, and which scenarios test it.

The seed article (a Chinese blog post on checkpointing with FlashAttention, quoted in each claim) states its
numbers without measuring them. Each ``Claim`` here pins one statement down: the original sentence, an English
summary, the claimed memory saving with the tolerance we judge it by, and the claimed overhead as a numeric band.
A scenario tests a claim by setting ``article: <claim id>`` in its suite file; the report puts the claim and the
measurement side by side and gives a verdict (``pytest_flashckpt.report.claim_verdicts``).

This module is plain data on purpose: the report, the ``flashckpt`` command and the docs read it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MIN_WORKLOADS = 3
"""A table row is judged over at least this many workloads (sequence lengths and/or cards), never one chosen point."""

SAVING_TOLERANCE = 0.10
"""A claimed saving "~X%" holds when the measured saving is within X ± 10 percentage points. "~" in the article is
a rounded figure; ten points is the gap between its own rows (30/50/70%) halved, so a measurement can never match
two rows at once."""


@dataclass(frozen=True)
class OverheadBand:
    """A step-time ratio (strategy / reference) range that a word such as "low" stands for; ``high`` None = open."""

    label: str
    low: float
    high: float | None
    why: str

    def contains(self, overhead: float) -> bool:
        return overhead > self.low and (self.high is None or overhead <= self.high)

    def describe(self) -> str:
        if self.high is None:
            return f"> {self.low:.2f}x"
        if self.low <= 1.0:
            return f"<= {self.high:.2f}x"
        return f"{self.low:.2f}x-{self.high:.2f}x"


# The article's overhead words, made numeric from published reference numbers only. What a strategy costs on the
# machine that runs the suite is the run's own measurement (the report states it beside the bands), never typed here.
OVERHEAD_BANDS: dict[str, OverheadBand] = {
    "low": OverheadBand(
        "low", 0.0, 1.10,
        "selective recompute costs +2-7% (Korthikanti et al. 2022), and an async save should add next to nothing "
        "to the step",
    ),
    "medium": OverheadBand(
        "medium", 1.10, 1.35,
        "the article's own gradient-checkpointing cost (+15-20%) and the +33% FLOPs of one extra forward pass "
        "(full recompute) fall here",
    ),
    "high": OverheadBand(
        "high", 1.35, None,
        "more than one extra forward's worth: full recompute measured at scale costs 36-39% "
        "(Korthikanti et al. 2022), and anything slower than that",
    ),
}


@dataclass(frozen=True)
class SaveCriterion:
    """The save half of a table row, made checkable: ``kind`` names what is measured, ``limit`` the bound.

    - ``stall``: the median per-save ``stall_vs_sync`` (stall / a plain sync save's total, same run) <= ``limit``;
    - ``bytes``: the median save writes fewer bytes than a full save (``bytes_vs_full`` < ``limit`` = 1);
    - ``schedule``: the memory-aware schedule deferred at least one save and took none above its threshold
      (``deferrals`` > 0 and ``forced_saves`` == 0)."""

    kind: Literal["stall", "bytes", "schedule"]
    text: str
    why: str
    limit: float | None = None


ASYNC_STALL_LIMIT = 0.10
"""An async save "adds next to nothing" when training waits at most 10% of what a synchronous save makes it wait.
Published: PyTorch DCP's async save cut a 7B model's checkpoint downtime from 148.8 s to 6.3 s (4%), and Llama3-8B
from ~50 s to < 0.5 s (1%); 10% leaves room for a small model, whose in-memory snapshot is a larger share."""

ASYNC_SAVE = SaveCriterion(
    "stall", f"async stall <= {ASYNC_STALL_LIMIT:.0%} of a sync save",
    "DCP async save: 7B downtime 148.8 s -> 6.3 s, Llama3-8B ~50 s -> < 0.5 s", ASYNC_STALL_LIMIT,
)
SELECTIVE_SAVE = SaveCriterion(
    "bytes", "selective save writes fewer bytes than a full save",
    "saving only the selected tensors (on top of a full base) is the point of select_params", 1.0,
)
SCHEDULED_SAVE = SaveCriterion(
    "schedule", "schedule deferred saves (> 0) and took none above its threshold",
    "memory-aware scheduling must defer a save while memory is high, and never skip one forever",
)


@dataclass(frozen=True)
class Claim:
    """One statement of the article: ``id`` is what a scenario's ``article`` field names."""

    id: str
    title: str  # the row name in the article's table, in English
    strategy: str  # the strategy the article recommends, in English
    quote: str  # the article's sentence or table row, as written (Chinese)
    summary: str  # English summary of the quote
    saving: float  # claimed memory saving, fraction of the reference peak
    overhead: OverheadBand  # claimed step-time overhead as a band of ratios
    overhead_text: str  # the overhead as the article words it, in English
    saving_tolerance: float = SAVING_TOLERANCE
    save: SaveCriterion | None = None  # the save half of a table row (None: the claim is about activations only)

    def describe_saving(self) -> str:
        return f"~{self.saving * 100:.0f}%"

    def describe_overhead(self) -> str:
        return f"{self.overhead_text} ({self.overhead.describe()})"


PROTOTYPE = Claim(
    id="prototype",
    title="quick prototype",
    strategy="basic checkpoint + async save",
    quote="快速原型验证 | 基础Checkpoint + 异步保存 | ~30% | 低",
    summary="quick prototyping: basic checkpointing plus asynchronous saves saves ~30% memory at low overhead",
    saving=0.30,
    overhead=OVERHEAD_BANDS["low"],
    overhead_text="low",
    save=ASYNC_SAVE,
)

MEDIUM = Claim(
    id="medium",
    title="medium-scale training",
    strategy="gradient checkpointing + selective save",
    quote="中等规模训练 | 梯度检查点 + 选择性保存 | ~50% | 中",
    summary="medium-scale training: gradient checkpointing plus selective saves saves ~50% memory at medium overhead",
    saving=0.50,
    overhead=OVERHEAD_BANDS["medium"],
    overhead_text="medium",
    save=SELECTIVE_SAVE,
)

LARGE = Claim(
    id="large",
    title="very large models",
    strategy="layer-wise checkpoint + dynamic scheduling",
    quote="超大规模模型 | 分层Checkpoint + 动态调度 | ~70% | 高",
    summary="very large models: layer-wise checkpoints plus memory-aware save scheduling save ~70% memory at high overhead",
    saving=0.70,
    overhead=OVERHEAD_BANDS["high"],
    overhead_text="high",
    save=SCHEDULED_SAVE,
)

GRADIENT_CHECKPOINTING = Claim(
    id="gradient_checkpointing",
    title="gradient checkpointing",
    strategy="gradient checkpointing (every block recomputed)",
    quote="启用梯度检查点可减少约40%的显存占用，但会增加15%-20%的计算时间",
    summary="enabling gradient checkpointing cuts GPU memory use by about 40% but adds 15-20% compute time",
    saving=0.40,
    # 15-20% widened by 5 points each side: interleaved timing on a shared machine spreads by that much.
    overhead=OverheadBand("+15-20%", 1.10, 1.25, "the article's 15-20%, widened by 5 points for timing noise"),
    overhead_text="+15-20%",
)

TABLE: tuple[Claim, ...] = (PROTOTYPE, MEDIUM, LARGE)
"""The article's scenario table, in its order."""

CLAIMS: dict[str, Claim] = {c.id: c for c in (*TABLE, GRADIENT_CHECKPOINTING)}


@dataclass(frozen=True)
class PublishedRatio:
    """A published memory ratio the report quotes beside our measurement (not a claim of the article)."""

    seq_len: int
    ratio: float
    source: str


FLASH_ATTENTION_MEMORY = (
    PublishedRatio(2048, 10.0, "FlashAttention (Dao et al. 2022): attention memory 10x smaller at 2K"),
    PublishedRatio(4096, 20.0, "FlashAttention (Dao et al. 2022): attention memory 20x smaller at 4K"),
)

FLASH_ACTIVATION_QUOTE = "Flash-Attention通过即时计算替代部分激活值存储，将激活内存占用减少50%-70%"
FLASH_ACTIVATION_SUMMARY = "the article: FlashAttention's recomputation cuts activation memory by 50-70%"
