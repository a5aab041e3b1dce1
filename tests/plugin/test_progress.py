"""What a suite run prints while it runs and at its end (through pytest's terminal reporter, honouring -q/-v),
and what it adds to the JUnit XML; pytest runs in this process (``runpytest_inprocess``), the full lines from real
measurements (MFU and roofline included), the compact ones from a fake (``fake_runner``, tests/conftest.py)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

SUITE = """
name: prog
defaults: {model: tiny, batch_size: 1, seq_len: 32, rounds: 2, measure: [memory, timing], attention: eager}
scenarios:
  - name: reference
  - name: full
    activation: {strategy: full}
    article: prototype
"""


@pytest.mark.slow
def test_a_line_per_scenario_an_end_table_and_junit_properties(pytester):
    suite = pytester.makefile(".yaml", prog=SUITE)
    result = pytester.runpytest_inprocess(f"--flashckpt-suite={suite}", "--flashckpt-device=cpu", "-p", "no:benchmark",
                                "--junitxml=junit.xml")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        "prog::reference: kernel eager, peak *MiB*-> no baseline",
        "prog::full: kernel eager, peak *MiB, saving *, overhead *x, MFU *% of roofline (HFU *%) -> no baseline",
        "*= flashckpt =*",
        "the article's claims*",
        "quick prototype*full*",
        "baseline:",
        "  no baseline for profile cpu-* in baselines",
        "report: flashckpt-report/flashckpt-report.md (results: flashckpt-report/results.json)",
    ])
    assert not any(line.startswith("prog .") for line in result.outlines)  # the lines replace the dots
    cases = ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")
    props = {c.get("name"): {p.get("name"): p.get("value") for p in c.iter("property")} for c in cases}
    assert props["full"]["kernel"] == "eager" and props["full"]["backend"] == "eager"
    assert props["full"]["probe"] == "cpu" and props["full"]["device"] == "cpu"


def test_quiet_prints_compact_lines_and_no_article_table(pytester, fake_runner):
    suite = pytester.makefile(".yaml", prog=SUITE)
    result = pytester.runpytest_inprocess(f"--flashckpt-suite={suite}", "--flashckpt-device=cpu", "-p", "no:benchmark", "-q",
                                "-k", "reference")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["prog::reference: peak *MiB -> no baseline"])
    assert "kernel" not in result.stdout.str() and "the article's claims" not in result.stdout.str()
