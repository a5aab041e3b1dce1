"""The markdown report renders from recorded results: every section, skip reasons, no raw floats."""

from __future__ import annotations

import dataclasses
import re

import report_synthetic as syn

from pytest_flashckpt.report import render
from pytest_flashckpt.core.comparison import Comparison
from pytest_flashckpt.core.result import RunRecord
from pytest_flashckpt.config.record_file import read_record

SECTIONS = [
    "## The article's scenario table, measured",
    "## The article's single claim: gradient checkpointing",
    "## Activation checkpointing strategies",
    "## Attention backends vs sequence length",
    "## Checkpoint I/O",
    "## Regressions against the baseline",
    "## All scenarios",
]


def _table_rows(text: str, heading: str) -> list[str]:
    """The data rows of the first table in the section that starts with ``heading``."""
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    rows: list[str] = []
    for line in section.splitlines():
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break  # the first table ended
    return rows[2:]  # skip header and separator


def test_every_section_in_order(record: RunRecord) -> None:
    text = render(record)
    positions = [text.index(s) for s in SECTIONS]
    assert positions == sorted(positions)


def test_header_names_profile_commit_versions_kernel_probe_rounds(record: RunRecord) -> None:
    head = render(record).split("## ", 1)[0]
    for expected in ("cpu-2t-synthetic", "abc123", "2000-01-01", "torch 0.0.0", "CUDA none", "flash-attn not installed",
                     "`eager` -> `eager`", "`sdpa` -> `sdpa-flash-cpu`", "memory probe** `cpu`", "5 interleaved timing rounds"):
        assert expected in head, expected


def test_article_table_has_one_row_per_claim_with_verdicts(record: RunRecord) -> None:
    rows = _table_rows(render(record), "## The article's scenario table, measured")
    assert [r.split("|")[1].strip() for r in rows] == ["quick prototype", "medium-scale training", "very large models"]
    # each row is its own configuration, over three workloads, with its save criterion and the measured save
    assert "recompute selective_op; save async (torch)" in rows[0] and "recompute full; save selective (torch)" in rows[1]
    assert "3: tiny 4x256, tiny 4x512, tiny 4x1024" in rows[0]
    assert "async stall <= 10% of a sync save" in rows[0] and "5% of a sync save" in rows[0]
    assert "fewer bytes than a full save" in rows[1] and "60% of a full save's bytes" in rows[1]
    assert "deferred saves" in rows[2] and "0 deferrals" in rows[2]
    assert "**holds on 3 of 3**" in rows[0] and "**holds on 2 of 3**" in rows[1] and "**holds on 0 of 3**" in rows[2]
    assert "saving 45-65%" in rows[1]  # the count comes with the range
    assert "~30%" in rows[0] and "low (<= 1.10x)" in rows[0]
    details = _table_rows(render(record), "Per workload:")
    assert len(details) == 9 and any("never deferred" in d for d in details)


def test_article_table_says_why_a_claim_was_not_measured() -> None:
    results = [r for r in syn.results() if r.config.article != "large"]
    text = render(syn.record(results))
    row = [r for r in _table_rows(text, "## The article's scenario table") if "very large models" in r][0]
    assert "**not measurable**: no scenario with article: large ran in this suite" in row


def test_skipped_article_scenario_shows_its_reason() -> None:
    results = syn.results()
    medium = next(r for r in results if r.scenario == "medium-s512")
    medium.status, medium.reason, medium.metrics = "skipped", "SYNTHETIC-SKIP needs a GPU", {}
    text = render(syn.record(results))
    row = [r for r in _table_rows(text, "## The article's scenario table") if "medium-scale" in r][0]
    assert "**holds on 1 of 3**, 1 not measurable" in row
    assert "**not measurable**: skipped on this hardware: SYNTHETIC-SKIP needs a GPU" in text


def test_unknown_article_tag_is_reported() -> None:
    results = syn.results()
    results[0].config = dataclasses.replace(results[0].config, article="no-such-claim")
    assert "`no-such-claim`" in render(syn.record(results))


def test_single_claim_beside_our_number(record: RunRecord) -> None:
    text = render(record)
    part = text.split("## The article's single claim", 1)[1].split("## ", 1)[0]
    assert "40%" in part and "15%-20%" in part  # the quote
    assert "`synthetic::gc`" in part and "**holds**" in part


def test_skipped_scenarios_show_reasons_not_empty_cells(record: RunRecord) -> None:
    text = render(record)
    assert "skipped: SYNTHETIC-SKIP offload needs a CUDA device" in text  # all-scenarios table
    assert "[1] SYNTHETIC-SKIP offload needs a CUDA device" in text  # footnote in the activation table
    assert "[1] SYNTHETIC-SKIP flash-attn is not installed" in text  # footnote in the attention table
    for line in text.splitlines():
        if line.startswith("|"):
            assert "||" not in line.replace(" ", ""), line  # no empty cell


def test_no_raw_long_floats(record: RunRecord) -> None:
    assert not re.search(r"\d\.\d{5,}", render(record))


def test_attention_section_ratios_and_published_numbers(record: RunRecord) -> None:
    part = render(record).split("## Attention backends", 1)[1].split("## ", 1)[0]
    assert "4.00x step" in part  # 400 MiB eager / 100 MiB sdpa
    assert "10x (attention only)" in part
    assert "not attention" in part  # why whole-step ratios are smaller


def test_regression_verdicts_rendered(record: RunRecord) -> None:
    part = render(record).split("## Regressions", 1)[1].split("## ", 1)[0]
    assert "**regressed**" in part and "+12.5%" in part and "baselines/synthetic.json" in part


def test_comparison_statuses() -> None:
    assert "No baseline comparison was recorded" in render(syn.record(comparison_=None))
    other = Comparison("other-profile", "b.json", "gpu-x", None)
    assert "another hardware/software profile" in render(syn.record(comparison_=other))
    none = Comparison("no-baseline", None, None, "run with --flashckpt-save-baseline")
    text = render(syn.record(comparison_=none))
    assert "no stored baseline" in text and "--flashckpt-save-baseline" in text


def test_sections_without_data_say_so_in_one_line() -> None:
    text = render(syn.record([]))
    for section in SECTIONS:
        assert section in text
    assert "No activation-checkpointing scenario" in text
    assert "No attention-kernel comparison" in text
    assert "No scenario with a save strategy" in text
    assert "No scenario ran" in text


def test_a_record_in_the_old_shape_renders_as_it_does_rewritten_in_the_new(tmp_path) -> None:
    """tests/data/results-old-shape.json (five scenarios of the sample as committed before the typed measurements:
    per-save samples as ``<metric>_samples``, the gate's notes inside the comparison's message) loads into the typed
    shape, shows its message whole, and written back in the new shape and read again renders the same."""
    from pathlib import Path

    old_file = Path(__file__).resolve().parents[1] / "data" / "results-old-shape.json"
    old = read_record(old_file)
    assert old.comparison is not None and old.comparison.notes == [] and "; checkpoint::" in (old.comparison.message or "")
    assert old.comparison.text == old.comparison.message  # the message is shown whole, as it was written
    rewritten = tmp_path / "results.json"
    old.write_json(rewritten)
    new = read_record(rewritten)
    assert not any(name.endswith("_samples") for r in new.results for name in r.samples)
    assert render(new) == render(old)


def test_header_counts_the_scenarios_that_added_confirmation_rounds(record: RunRecord) -> None:
    """runner/confirm.py: a reader must see that some scenarios' ratios rest on more rounds than the suite names."""
    assert "confirmation rounds" not in render(record).split("## ", 1)[0]  # control: none added
    timed = next(r for r in record.results if "overhead" in r.metrics)
    timed.metrics["confirmation_rounds"] = 5
    head = render(record).split("## ", 1)[0]
    assert "and 5 confirmation rounds in 1 scenario(s) whose first rounds read slower than the baseline" in head
