"""Verdict logic on the article's claims, on synthetic results."""

from __future__ import annotations

import pytest
import report_synthetic as syn

from pytest_flashckpt.core.claims import CLAIMS, GRADIENT_CHECKPOINTING, LARGE, MEDIUM, OVERHEAD_BANDS, PROTOTYPE, TABLE
from pytest_flashckpt.config.scenario import ActivationConfig, SaveConfig, Scenario
from pytest_flashckpt.report.claim_verdicts import judge, judge_row


def _measured(saving: float, overhead: float, spread: float = 0.01):
    """An activation-only result (no save measured: a table row's save half is then not measurable)."""
    return syn.strategy("x", saving, overhead, ActivationConfig("full"), spread=spread)


def _row_result(claim, saving: float, overhead: float, **save):
    """A result with a save that meets ``claim``'s criterion unless ``save`` says otherwise."""
    metrics = syn.save_metrics(0.05, 1.0, bytes_share=0.5, deferrals=3) | save
    return syn.strategy("x", saving, overhead, ActivationConfig("full"), SaveConfig(strategy="sync"), spread=0.01, **metrics)


@pytest.mark.parametrize(
    ("claim", "saving", "overhead", "word"),
    [
        (PROTOTYPE, 0.30, 1.05, "holds"),
        (PROTOTYPE, 0.21, 1.09, "holds"),  # inside the ±10 pp tolerance
        (PROTOTYPE, 0.45, 1.05, "does not hold"),  # saves more than claimed
        (PROTOTYPE, 0.30, 1.20, "does not hold"),  # not low
        (MEDIUM, 0.50, 1.20, "holds"),
        (MEDIUM, 0.66, 1.24, "does not hold"),
        (LARGE, 0.70, 1.50, "holds"),
        (LARGE, 0.66, 1.24, "does not hold"),  # saving in tolerance, overhead medium, not high
        (GRADIENT_CHECKPOINTING, 0.40, 1.18, "holds"),
        (GRADIENT_CHECKPOINTING, 0.40, 1.40, "does not hold"),
    ],
)
def test_measured_verdicts(claim, saving: float, overhead: float, word: str) -> None:
    assert judge(claim, _row_result(claim, saving, overhead)).word == word


@pytest.mark.parametrize(
    ("claim", "save", "text"),
    [
        (PROTOTYPE, {"stall_vs_sync": 0.25}, "save stall 25.0% of a sync save is above 10%"),
        (MEDIUM, {"bytes_vs_full": 1.0}, "a save writes 100.0% of a full save's bytes: not fewer"),
        (LARGE, {"deferrals": 0}, "schedule: 0 deferrals, 0 saves forced above the threshold (never deferred)"),
        (LARGE, {"deferrals": 4, "forced_saves": 1}, "schedule: 4 deferrals, 1 saves forced above the threshold"),
    ],
)
def test_the_save_half_of_a_row_is_judged(claim, save, text) -> None:
    good = {PROTOTYPE: (0.30, 1.05), MEDIUM: (0.50, 1.20), LARGE: (0.70, 1.50)}[claim]
    assert judge(claim, _row_result(claim, *good)).word == "holds"
    verdict = judge(claim, _row_result(claim, *good, **save))
    assert verdict.word == "does not hold" and text in verdict.reason


def test_a_row_without_a_measured_save_is_not_measurable() -> None:
    verdict = judge(PROTOTYPE, _measured(0.30, 1.05))
    assert verdict.word == "not measurable" and "the scenario did not measure a save" in verdict.reason


def test_a_row_over_workloads_is_a_count_and_a_range() -> None:
    results = [_row_result(MEDIUM, saving, 1.20) for saving in (0.38, 0.52, 0.58)]
    row = judge_row(MEDIUM, results)
    assert row.word == "holds on 2 of 3" and "saving 38-58%" in row.ranges
    assert row.cell().startswith("**holds on 2 of 3**: saving 38-58%")
    assert "only 2 workloads" in judge_row(MEDIUM, results[:2]).cell()


def test_a_range_whose_ends_read_alike_is_one_value() -> None:
    """The article table's save column: shares that differ below the shown precision (74.6% and 75.2%) read "75%",
    not "75%-75%"; shares that read apart keep their range."""
    from pytest_flashckpt.report.article import _save_range

    def column(*shares):
        return _save_range(MEDIUM, [_row_result(MEDIUM, 0.5, 1.2, bytes_vs_full=share) for share in shares])

    assert column(0.746, 0.752) == "75% of a full save's bytes"
    assert column(0.70, 0.752) == "70%-75% of a full save's bytes"


def test_reason_names_the_part_that_missed() -> None:
    verdict = judge(LARGE, _measured(0.55, 1.30))
    assert "saving 55.0% is below ~70% ± 10 pp" in verdict.reason
    assert "overhead 1.30x (rounds 1.29-1.31) is below high (> 1.35x)" in verdict.reason


def test_no_result_is_not_measurable_with_reason() -> None:
    verdict = judge(MEDIUM, None)
    assert verdict.word == "not measurable"
    assert verdict.reason == "no scenario with article: medium ran in this suite"


def test_skipped_result_is_not_measurable_with_skip_reason() -> None:
    r = syn.result(Scenario(name="s", suite="x"), status="skipped", reason="SYNTHETIC-SKIP no GPU")
    verdict = judge(LARGE, r)
    assert verdict.word == "not measurable" and "SYNTHETIC-SKIP no GPU" in verdict.reason


def test_missing_overhead_is_not_measurable_unless_the_saving_already_fails() -> None:
    r = _measured(0.30, 1.05)
    for key in ("overhead", "overhead_min", "overhead_max"):
        del r.metrics[key]
    assert judge(PROTOTYPE, r).word == "not measurable"
    assert "overhead not measurable" in judge(PROTOTYPE, r).reason
    assert judge(LARGE, r).word == "does not hold"  # 30% vs ~70% misses whatever the overhead


def test_bands_are_contiguous_and_ordered() -> None:
    low, medium, high = OVERHEAD_BANDS["low"], OVERHEAD_BANDS["medium"], OVERHEAD_BANDS["high"]
    assert low.high == medium.low and medium.high == high.low and high.high is None
    assert low.contains(1.0) and low.contains(1.10) and medium.contains(1.11) and high.contains(2.0)


def test_claims_cover_the_article_table() -> None:
    assert [c.id for c in TABLE] == ["prototype", "medium", "large"]
    assert [c.saving for c in TABLE] == [0.30, 0.50, 0.70]
    assert set(CLAIMS) == {"prototype", "medium", "large", "gradient_checkpointing"}
    assert all(c.quote for c in CLAIMS.values())


def test_overhead_is_judged_on_the_rounds_interval_symmetrically() -> None:
    r = _row_result(LARGE, 0.70, 1.30)
    r.metrics["overhead_min"], r.metrics["overhead_max"] = 1.10, 1.60  # median outside "high", rounds reach into it
    verdict = judge(LARGE, r)
    assert verdict.word == "not measurable" and "straddles high" in verdict.reason
    r = _row_result(MEDIUM, 0.50, 1.30)
    r.metrics["overhead_min"], r.metrics["overhead_max"] = 1.20, 1.40  # median inside "medium", rounds leave it
    assert judge(MEDIUM, r).word == "not measurable"
    r.metrics["overhead_max"] = 1.34  # the whole interval inside: holds
    assert judge(MEDIUM, r).word == "holds"
    r = _row_result(LARGE, 0.70, 1.30)
    r.metrics["overhead_min"], r.metrics["overhead_max"] = 1.20, 1.34  # entirely below "high": a miss
    assert judge(LARGE, r).word == "does not hold"
