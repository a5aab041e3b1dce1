"""Verdict logic on the article's claims, on synthetic results."""

from __future__ import annotations

import pytest
import report_synthetic as syn

from pytest_flashckpt.claims import CLAIMS, GRADIENT_CHECKPOINTING, LARGE, MEDIUM, OVERHEAD_BANDS, PROTOTYPE, TABLE
from pytest_flashckpt.config.scenario import ActivationConfig, Scenario
from pytest_flashckpt.report.claim_verdicts import judge


def _measured(saving: float, overhead: float):
    return syn.strategy("x", saving, overhead, ActivationConfig("full"))


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
    assert judge(claim, _measured(saving, overhead)).word == word


def test_reason_names_the_part_that_missed() -> None:
    verdict = judge(LARGE, _measured(0.55, 1.30))
    assert "saving 55.0% is below ~70% ± 10 pp" in verdict.reason
    assert "overhead 1.30x is below high (> 1.35x)" in verdict.reason


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


def test_noisy_overhead_is_not_judged() -> None:
    r = _measured(0.70, 1.30)
    r.metrics["overhead_min"], r.metrics["overhead_max"] = 1.10, 1.60  # the rounds reach into "high"
    verdict = judge(LARGE, r)
    assert verdict.word == "not measurable" and "too noisy to judge" in verdict.reason
    r.metrics["overhead_max"] = 1.34  # entirely below "high": a miss
    assert judge(LARGE, r).word == "does not hold"
