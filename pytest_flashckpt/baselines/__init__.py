"""Baselines per hardware profile and the noise-aware regression gate.

``store`` reads and writes ``baselines/<profile_id>.json``; ``regression_verdicts`` judges one metric (exact counts, memory
with a tolerance, timing ratios with a tolerance and a Mann-Whitney test from ``stats``); ``gate`` runs that for
a suite run and builds ``RunRecord.comparison`` (``report.terminal`` and ``report.regression`` render it).
"""

from pytest_flashckpt.baselines.gate import Gate, failure_text
from pytest_flashckpt.baselines.store import Baseline, BaselineError, locate, save_run
from pytest_flashckpt.baselines.regression_verdicts import Thresholds, compare_scenario, judge_sampled

__all__ = ["Baseline", "BaselineError", "Gate", "Thresholds", "compare_scenario", "failure_text", "judge_sampled", "locate", "save_run"]
