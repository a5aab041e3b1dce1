"""``flashckpt ab``: REFs checked before anything runs, B's rounds gated against A's, the markdown table, and (slow)
a real A/B job between two trees with a regression injected into B."""

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_flashckpt.ab.rounds import Rounds
from pytest_flashckpt.ab.suite_source import from_here
from pytest_flashckpt.ab.trees import RefError, Side, Tree, checked_out, resolve_path, resolve_ref
from pytest_flashckpt.ab.verdicts import Job, gate, markdown
from pytest_flashckpt.baselines.regression_verdicts import Thresholds
from pytest_flashckpt.cli import main
from pytest_flashckpt.core.result import Result, RunRecord
from pytest_flashckpt.config.scenario import Scenario

ROOT = Path(__file__).resolve().parents[2]


def _record(overhead, peak=100, stall=None):
    r = Result("ab", "x", "measured", Scenario("x", suite="ab"), probe="cpu")
    r.metrics = {"overhead": overhead, "peak_bytes": peak}
    if stall is not None:
        r.metrics["stall_vs_copy"] = stall
    return RunRecord({}, "p", "t", None, "ab", "cpu", "cpu", [r])


def _rounds(a, b, **kw):
    return Rounds({"a": [_record(v, **kw) for v in a], "b": [_record(v, **kw) for v in b]})


A = [1.08, 1.07, 1.09, 1.08, 1.06, 1.08]


def test_same_code_is_ok_and_a_slower_b_is_regressed():
    ok = gate(_rounds(A, [1.07, 1.09, 1.08, 1.08, 1.07, 1.09]), Thresholds())
    assert {r.metric: r.verdict for r in ok.rows} == {"overhead": "ok", "peak_bytes": "ok"} and not ok.failed
    slow = gate(_rounds(A, [v * 1.10 for v in A]), Thresholds())
    row = next(r for r in slow.rows if r.metric == "overhead")
    assert row.verdict == "regressed" and row.p_value == pytest.approx(1 / 924) and slow.failed


def test_an_exact_count_that_grows_in_b_is_regressed():
    out = gate(Rounds({"a": [_record(1.0)] * 3, "b": [_record(1.0, peak=101)] * 3}), Thresholds())
    assert {r.metric: r.verdict for r in out.rows}["peak_bytes"] == "regressed"


def test_a_scenario_b_never_measured_is_missing():
    broken = _record(1.0)
    broken.results[0].status = "error"
    out = gate(Rounds({"a": [_record(1.0)] * 2, "b": [broken] * 2}), Thresholds())
    assert [r.verdict for r in out.rows] == ["missing"] and out.failed


def test_markdown_names_both_versions_the_rounds_and_the_rule():
    rounds = _rounds(A, [v * 1.10 for v in A])
    out = gate(rounds, Thresholds())
    trees = {"a": Tree(Side("--a", "main"), ROOT, "0123456789abcdef" * 2 + "01234567"),
             "b": Tree(Side("--b-path", "/x/tree"), ROOT, None)}
    job = Job(trees, from_here("ab"), rounds, Thresholds(), "flashckpt ab --a main --b-path /x/tree", 1.5, (0.5, 0.7))
    text = markdown(job, out)
    assert "`--a main`" in text and "commit `0123456789abcdef0123456789abcdef01234567`" in text
    assert "`--b-path /x/tree`" in text and "6 interleaved rounds" in text
    assert "**1 regressed or missing**" in text and "p = 0.0011" in text and "| regressed |" in text.replace("**", "")


def test_sides_are_checked_before_anything_runs(tmp_path, capsys):
    with pytest.raises(RefError, match="no pytest_flashckpt package"):
        resolve_path(Side("--a-path", str(tmp_path)))
    with pytest.raises(RefError, match="no commit, branch or tag of that name"):
        resolve_ref(Side("--b", "no-such-branch-xyz"), ROOT)
    assert resolve_path(Side("--a-path", str(ROOT))) == ROOT
    assert main(["ab", "--a-path", str(ROOT), "--b", "no-such-branch-xyz", "--out", str(tmp_path / "o")]) == 2
    assert "--b no-such-branch-xyz: no commit, branch or tag" in capsys.readouterr().err
    assert main(["ab", "--a-path", str(ROOT), "--b-path", str(ROOT), "--inject-b", "step=x", "--out", str(tmp_path / "o")]) == 2
    assert "--inject-b step=x" in capsys.readouterr().err
    assert main(["ab", "--a-path", str(ROOT), "--b-path", str(ROOT), "--suite", "no-such-suite", "--out", str(tmp_path / "o")]) == 2
    assert "no-such-suite" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_git_ref_is_checked_out_and_removed(tmp_path):
    repo = tmp_path / "repo"
    (repo / "pytest_flashckpt").mkdir(parents=True)
    (repo / "pytest_flashckpt" / "__init__.py").write_text("")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "-C", str(repo), "add", "."], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-qm", "x"], check=True)
    with checked_out({"a": Side("--a", "HEAD"), "b": Side("--b-path", str(repo))}, repo) as trees:
        checkout = trees["a"].root
        assert (checkout / "pytest_flashckpt" / "__init__.py").is_file() and len(trees["a"].commit) == 40
        assert trees["b"].root == repo.resolve() and trees["b"].commit == trees["a"].commit
        assert trees["b"].state.changes == ()
    assert not checkout.exists()
    assert "flashckpt-ab" not in subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True).stdout


@pytest.mark.slow
def test_a_real_ab_job_runs_both_trees_and_judges_an_injected_slowdown(tmp_path):
    """Two trees (both this one), B with a 30% step slowdown, 5 rounds: ten processes, one overhead row that sees the
    slowdown, and the exit status that row's verdict implies. On a loaded machine 5 vs 5 rounds may overlap (`~`:
    one run at load 2-10 measured +27.6%, p = 0.028), so the verdict itself is not asserted."""
    suite = tmp_path / "one.yaml"
    suite.write_text((ROOT / "suites" / "ab.yaml").read_text().split("  - name: save-async")[0])
    proc = subprocess.run([sys.executable, "-m", "pytest_flashckpt.cli", "ab", "--a-path", str(ROOT), "--b-path", str(ROOT),
                           "--suite", str(suite), "--suite-from", "here", "--rounds", "5", "--inject-b", "step=0.30", "--out", str(tmp_path / "ab")],
                          capture_output=True, text=True, cwd=tmp_path)
    text = (tmp_path / "ab" / "ab.md").read_text()
    assert len(list((tmp_path / "ab").glob("round-*/results.json"))) == 10
    row = next(line for line in text.splitlines() if "| overhead" in line)
    change = float(row.split("|")[5].strip().rstrip("%"))
    assert change > 10, row
    verdict = row.split("|")[8].strip().strip("*")
    assert proc.returncode == (1 if verdict == "regressed" else 0), proc.stdout[-2000:] + proc.stderr[-2000:]
