"""Under pytest-xdist (``-n 2``) the suite's scenarios run one after another on one worker, the controller gathers
every result and writes results.json and the report once, and the header says other tests shared the CPU. The
workers measure through the shared ``FakeRunner`` (tests/fake_runner.py, through a conftest in the run's folder): what is
checked is where each scenario ran and what the controller gathered, not the numbers."""

from __future__ import annotations

import json
import re

import pytest
from fake_runner import conftest_text

pytest.importorskip("xdist", reason="pytest-xdist is not installed (pip install pytest-xdist to run this test)")

pytestmark = pytest.mark.xdist

SUITE = """
name: par
defaults: {model: tiny, batch_size: 1, seq_len: 64, measure: [memory], attention: eager}  # what is checked: where each ran
scenarios:
  - name: reference
  - name: full
    activation: {strategy: full}
  - name: every2
    activation: {strategy: every_k, k: 2}
"""


@pytest.mark.slow
def test_two_workers_lose_no_result_and_never_run_scenarios_side_by_side(pytester):
    suite = pytester.makefile(".yaml", par=SUITE)
    pytester.makeconftest(conftest_text())  # every worker measures through a FakeRunner
    pytester.makepyfile(test_other="def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    # the controller in this process (torch is imported already), its two workers fresh ones; no hypothesis plugin
    # (it imports hypothesis at each worker's end; nothing here uses it)
    result = pytester.runpytest_inprocess("test_other.py", f"--flashckpt-suite={suite}", "--flashckpt-device=cpu",
                                          "-p", "no:benchmark", "-p", "no:hypothesispytest", "-n", "2", "-v")
    result.assert_outcomes(passed=5)
    workers = {m.group(2): m.group(1) for m in re.finditer(r"\[(gw\d+)\].*? PASSED (par::\S+?)(@\S+)?\s", result.stdout.str())}
    assert set(workers) == {"par::reference", "par::full", "par::every2"}, result.stdout.str()
    assert len(set(workers.values())) == 1  # one worker: the scenarios ran one after another
    data = json.loads((pytester.path / "flashckpt-report" / "results.json").read_text())
    assert [r["scenario"] for r in data["results"]] == ["reference", "full", "every2"]  # all of them, in suite order
    assert all(r["status"] == "measured" for r in data["results"])
    assert all(r["metrics"]["state_bytes"] == 50 * 2**20 for r in data["results"])  # the workers' FakeRunner
    assert any("pytest-xdist ran this session on 2 worker(s)" in note for note in data["notes"])
    report = (pytester.path / "flashckpt-report" / "flashckpt-report.md").read_text()
    assert "- **note**: pytest-xdist ran this session on 2 worker(s)" in report
    result.stdout.fnmatch_lines(["*PASSED par::full*", "    kernel eager, peak *", "report: flashckpt-report/flashckpt-report.md*"])


def test_dist_each_is_refused_naming_the_option(pytester):
    suite = pytester.makefile(".yaml", par=SUITE)
    result = pytester.runpytest_inprocess(f"--flashckpt-suite={suite}", "-p", "no:benchmark", "-n", "2", "--dist", "each")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--flashckpt-suite cannot run under pytest-xdist's --dist each*drop -n*"])
