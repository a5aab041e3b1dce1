"""``flashckpt ab`` names each side unambiguously and says what ran: a REF is always a git commit (a folder of that
name is never run), uncommitted changes are named and not measured unless asked for, ab.md names full SHAs, the
suite's file and commit, both sides' profiles, and refuses two profiles; the suite comes from A's tree; ``--out``
must be a new folder.

No real suite rounds: each tree is a fake ``pytest_flashckpt`` package whose ``cli.py`` writes a prepared
``results.json`` and logs which tree's code ran (its ``tag.txt``) and which suite file it was given, so a test sees
exactly what each round process ran, in a fraction of a second."""

import json
import subprocess
from pathlib import Path

import pytest

from pytest_flashckpt.ab.rounds import run_once
from pytest_flashckpt.ab.trees import Side, Tree, resolve_ref
from pytest_flashckpt.cli import main
from pytest_flashckpt.core.result import Result, RunRecord
from pytest_flashckpt.config.scenario import Scenario

ROOT = Path(__file__).resolve().parents[2]
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main", "-c", "advice.detachedHead=false"]
PROFILE = {"device_type": "cpu", "device_name": "Fake CPU", "device_count": 1, "cpu_threads": 2, "torch": "2.13.0",
           "cuda": None, "flash_attn": None, "kernel": "sdpa", "machine": "x86_64"}

FAKE_CLI = '''\
import json, os, sys
from pathlib import Path

args = sys.argv[1:]
here = Path(__file__).resolve().parent
report = Path(args[args.index("--report") + 1])
report.mkdir(parents=True, exist_ok=True)
(report / "results.json").write_text((here / "record.json").read_text())
with open(os.environ["AB_TEST_LOG"], "a") as log:
    log.write((here / "tag.txt").read_text().strip() + " " + args[args.index("--suite") + 1] + "\\n")
'''


def _record_json(overhead=1.10, profile=PROFILE, profile_id="cpu-2t-torch2.13.0-fake0001", config=None) -> str:
    result = Result("ab", "selective_op-sdpa-s512", "measured", config or Scenario("selective_op-sdpa-s512", suite="ab", seq_len=512),
                    probe="cpu")
    result.metrics = {"overhead": overhead}
    return json.dumps(RunRecord(dict(profile), profile_id, "t", "c0ffee", "ab", "cpu", "cpu", [result],
                                tool_version="0.1.0").to_dict())


def plant(folder: Path, tag: str, **record) -> Path:
    """A fake tree at ``folder``: a package whose round writes a record and logs ``tag``, and the ab suite."""
    package = folder / "pytest_flashckpt"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "cli.py").write_text(FAKE_CLI)
    (package / "tag.txt").write_text(tag)
    (package / "record.json").write_text(_record_json(**record))
    (folder / "suites").mkdir(exist_ok=True)
    (folder / "suites" / "ab.yaml").write_text((ROOT / "suites" / "ab.yaml").read_text())
    return folder


def git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git repository (branch main, one commit of a fake tree tagged commit-main), the current folder; the rounds'
    log at tmp_path/log."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run([*GIT, "init", "-q", str(repo)], check=True)
    plant(repo, "commit-main")
    (repo / ".gitignore").write_text("")
    commit_all(repo, "main")
    monkeypatch.chdir(repo)
    monkeypatch.setenv("AB_TEST_LOG", str(tmp_path / "log"))
    return repo


def ran(tmp_path) -> list[str]:
    log = tmp_path / "log"
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


def suites_given(tmp_path) -> set[str]:
    return {line.split()[1] for line in (tmp_path / "log").read_text().splitlines()}


def ab(tmp_path, *args, out="out") -> int:
    return main(["ab", *args, "--rounds", "2", "--out", str(tmp_path / out)])


@pytest.mark.slow
def test_a_ref_never_runs_a_folder_of_that_name(repo, tmp_path, capsys):
    """A folder main/ (a pull request's own "base") beside the branch main: --a main runs the branch's commit; the
    folder's planted code runs only when named with --a-path (the control: it would act)."""
    plant(repo / "main", "planted-folder")
    assert ab(tmp_path, "--a", "main", "--b", "HEAD") == 0
    assert ran(tmp_path) == ["commit-main"] * 4
    text = (tmp_path / "out" / "ab.md").read_text()
    assert "`--a main`" in text and "planted-folder" not in text
    (tmp_path / "log").unlink()
    assert ab(tmp_path, "--a-path", "main", "--b", "HEAD", out="out2") == 0
    assert sorted(ran(tmp_path)) == ["commit-main", "commit-main", "planted-folder", "planted-folder"]


def test_a_ref_that_is_only_a_folder_is_refused_before_anything_runs(repo, tmp_path, capsys):
    plant(repo / "feature", "planted-folder")
    assert ab(tmp_path, "--a", "feature", "--b", "HEAD") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--a feature: no commit, branch or tag" in err
    assert "--a never runs a folder: --a-path feature does" in err
    assert ran(tmp_path) == [] and not (tmp_path / "out").exists()
    assert ab(tmp_path, "--a-path", "feature", "--b", "HEAD") == 0  # control: named as a folder, it runs
    assert "planted-folder" in ran(tmp_path)


def test_an_ambiguous_or_option_like_ref_is_refused(repo, tmp_path, capsys):
    git(repo, "branch", "v1")
    git(repo, "tag", "v1")
    assert ab(tmp_path, "--a", "v1", "--b", "HEAD") == 2
    assert "--a v1: ambiguous" in capsys.readouterr().err
    assert resolve_ref(Side("--a", "refs/heads/v1"), repo) == git(repo, "rev-parse", "HEAD")  # control: one ref is fine
    assert ab(tmp_path, "--a=--output=x", "--b", "HEAD") == 2
    assert "a ref cannot start with '-'" in capsys.readouterr().err
    assert ab(tmp_path, "--a-path", "no-such-folder", "--b", "HEAD") == 2
    assert "--a-path no-such-folder: no such folder" in capsys.readouterr().err
    assert ran(tmp_path) == []


def test_uncommitted_changes_are_named_and_measured_only_on_request(repo, tmp_path, capsys):
    """--a HEAD --b HEAD with an edit compares committed code (the edit is not run) and says so, in ab.md and on
    stdout; --b-path . runs the edit (the control) and names the changes as measured."""
    (repo / "pytest_flashckpt" / "tag.txt").write_text("edited")
    (repo / "new_module.py").write_text("")
    assert ab(tmp_path, "--a", "HEAD", "--b", "HEAD") == 0
    assert ran(tmp_path) == ["commit-main"] * 4
    out = capsys.readouterr().out
    text = (tmp_path / "out" / "ab.md").read_text()
    for shown in (text, out):
        assert "was NOT measured" in shown and "pytest_flashckpt/tag.txt" in shown and "new_module.py" in shown
        assert "--b-path ." in shown
    (tmp_path / "log").unlink()
    assert ab(tmp_path, "--a", "HEAD", "--b-path", ".", out="out2") == 0
    assert sorted(ran(tmp_path)) == ["commit-main", "commit-main", "edited", "edited"]
    text = (tmp_path / "out2" / "ab.md").read_text()
    assert "NOT measured" not in text and "2 uncommitted changes" in text and "uncommitted changes included" in text


def test_the_job_folder_inside_the_repository_is_not_a_change(repo, tmp_path, capsys):
    assert main(["ab", "--a", "HEAD", "--b", "HEAD", "--rounds", "2", "--out", "flashckpt-ab"]) == 0
    assert "NOT measured" not in (repo / "flashckpt-ab" / "ab.md").read_text()
    (repo / "stray.txt").write_text("")  # control: anything else untracked is named
    assert main(["ab", "--a", "HEAD", "--b", "HEAD", "--rounds", "2", "--out", "flashckpt-ab-2"]) == 0
    text = (repo / "flashckpt-ab-2" / "ab.md").read_text()
    warning = next(line for line in text.splitlines() if "NOT measured" in line)
    assert "stray.txt" in warning and "flashckpt-ab-2" not in warning  # its own folder is still left out


def test_ab_md_names_full_shas_folder_state_profile_and_versions(repo, tmp_path):
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "switch", "-qc", "feature")
    (repo / "pytest_flashckpt" / "tag.txt").write_text("commit-feature")
    head = commit_all(repo, "feature")
    other = plant(tmp_path / "other", "plain-folder")  # a path side in no repository
    assert ab(tmp_path, "--a", "main", "--b", head[:8]) == 0
    text = (tmp_path / "out" / "ab.md").read_text()
    assert f"commit `{base}`" in text and f"commit `{head}`" in text and "`--b " + head[:8] + "`" in text
    assert "cpu-2t-torch2.13.0-fake0001" in text and "| torch " in text and "2.13.0" in text and "Fake CPU" in text
    assert "Python " in text and "| pytest-flashckpt " in text
    assert ab(tmp_path, "--a", "main", "--b-path", str(other), out="out2") == 0
    assert f"folder `{other.resolve()}` (in no git repository" in (tmp_path / "out2" / "ab.md").read_text()


def test_rounds_on_two_profiles_get_no_verdict(repo, tmp_path, capsys):
    git(repo, "switch", "-qc", "threads")
    one_thread = dict(PROFILE, cpu_threads=1)
    (repo / "pytest_flashckpt" / "record.json").write_text(_record_json(profile=one_thread, profile_id="cpu-1t-fake"))
    commit_all(repo, "one thread")
    assert ab(tmp_path, "--a", "main", "--b", "main") == 0  # control: one profile, a verdict
    assert "no regression of 1 verdicts" in (tmp_path / "out" / "ab.md").read_text()
    capsys.readouterr()
    assert ab(tmp_path, "--a", "main", "--b", "threads", out="out2") == 1
    text = (tmp_path / "out2" / "ab.md").read_text()
    assert "**no verdict:" in text and "cpu_threads 2 vs 1" in text and "| overhead" not in text
    assert "cpu-1t-fake" in capsys.readouterr().err


def test_the_gating_suite_comes_from_a_not_from_the_pull_request(repo, tmp_path):
    """The pull request (B, also the checkout the command runs in) edits suites/ab.yaml: the rounds run A's file,
    and ab.md names it and A's commit; --suite-from here (the control) takes the checkout's file, the PR's."""
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "switch", "-qc", "pr")
    suite = repo / "suites" / "ab.yaml"
    suite.write_text(suite.read_text().replace("selective_op-sdpa-s512", "renamed-by-the-pr"))
    commit_all(repo, "pr edits the suite")
    assert ab(tmp_path, "--a", base, "--b", "HEAD") == 0
    given = suites_given(tmp_path)
    assert len(given) == 1 and Path(next(iter(given))).parent.parent.name == "a"  # A's temporary worktree
    assert f"suite `ab` from `suites/ab.yaml` of A's tree (--a {base}), commit `{base}`" in (tmp_path / "out" / "ab.md").read_text()
    (tmp_path / "log").unlink()
    assert ab(tmp_path, "--a", base, "--b", "HEAD", "--suite", "suites/ab.yaml", "--suite-from", "here", out="out2") == 0
    assert suites_given(tmp_path) == {str(suite.resolve())}


def test_a_suite_outside_a_or_with_includes_is_refused_under_suite_from_a(repo, tmp_path, capsys):
    (repo / "suites" / "inc.yaml").write_text("include: [ab]\n")
    commit_all(repo, "a suite with include")
    assert ab(tmp_path, "--a", "HEAD", "--b", "HEAD", "--suite", "inc") == 2
    assert "suites/inc.yaml: has include:" in capsys.readouterr().err
    assert ab(tmp_path, "--a", "HEAD", "--b", "HEAD", "--suite", str(repo / "suites" / "ab.yaml")) == 2
    assert "an absolute path is no file of A's tree" in capsys.readouterr().err
    assert ab(tmp_path, "--a", "HEAD", "--b", "HEAD", "--suite", "../outside.yaml") == 2
    assert "leads out of A's tree" in capsys.readouterr().err
    (repo / "suites" / "bad.yaml").write_text("scenarios:\n  - name: x\n    model: tiny\n    seq_len: -1\n")
    commit_all(repo, "a bad suite")
    assert ab(tmp_path, "--a", "HEAD", "--b", "HEAD", "--suite", "bad") == 2
    err = capsys.readouterr().err.strip()
    assert "error: suites/bad.yaml of A's tree (--a HEAD): scenario 'x': seq_len" in err and "flashckpt-ab-" not in err
    assert ab(tmp_path, "--a", "HEAD", "--b", "HEAD", "--suite", "no-such") == 2
    assert "unknown suite 'no-such' in A's tree (HEAD)" in capsys.readouterr().err
    assert ran(tmp_path) == [] and not (tmp_path / "out").exists()
    assert git(repo, "worktree", "list").count("\n") == 0  # the temporary worktree is gone


def test_out_must_be_a_new_folder(repo, tmp_path, capsys):
    taken = tmp_path / "ab.md"
    taken.write_text("keep me")
    assert main(["ab", "--a", "HEAD", "--b", "HEAD", "--out", str(taken)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a file, not a folder" in err and taken.read_text() == "keep me"
    earlier = tmp_path / "earlier"
    (earlier / "round-01-a").mkdir(parents=True)
    assert main(["ab", "--a", "HEAD", "--b", "HEAD", "--out", str(earlier)]) == 2
    assert "holds an earlier A/B job" in capsys.readouterr().err
    assert ran(tmp_path) == []


def test_an_earlier_jobs_round_would_be_read_as_this_ones(tmp_path, monkeypatch):
    """The control for refusing an earlier job's folder: a round whose process writes nothing reads back the
    results.json left there, as if it had measured."""
    tree = plant(tmp_path / "tree", "silent")
    (tree / "pytest_flashckpt" / "cli.py").write_text("")  # a round that writes nothing
    stale = tmp_path / "earlier" / "round-01-a"
    stale.mkdir(parents=True)
    (stale / "results.json").write_text(_record_json(overhead=9.99))
    record = run_once(Tree(Side("--a-path", str(tree)), tree, None), "ab", stale, (), "round 1, version a")
    assert record.results[0].metrics["overhead"] == 9.99


def test_the_parser_requires_one_form_per_side(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["ab", "--a", "main", "--a-path", ".", "--b", "HEAD"])
    assert exited.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["ab", "--a", "main"])
    assert "one of the arguments --b --b-path is required" in capsys.readouterr().err


@pytest.mark.slow
def test_a_scenario_b_ran_with_other_settings_is_named(repo, tmp_path):
    """B's code reads A's suite file its own way (a changed default): ab.md names the settings that differ; the
    control is every other test's ab.md (same settings, no note)."""
    git(repo, "switch", "-qc", "shorter")
    (repo / "pytest_flashckpt" / "record.json").write_text(_record_json(config=Scenario("selective_op-sdpa-s512", suite="ab", seq_len=256)))
    commit_all(repo, "B runs shorter sequences")
    assert ab(tmp_path, "--a", "main", "--b", "main") == 0
    assert "> **Note:**" not in (tmp_path / "out" / "ab.md").read_text()
    assert ab(tmp_path, "--a", "main", "--b", "shorter", out="out2") == 0
    assert "ran with other settings in B than in A: seq_len 512 vs 256" in (tmp_path / "out2" / "ab.md").read_text()


def test_ctrl_c_during_the_rounds_removes_the_worktrees_and_exits_2(repo, tmp_path, monkeypatch, capsys):
    from pytest_flashckpt.ab import rounds

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(rounds, "run_once", interrupted)
    assert ab(tmp_path, "--a", "HEAD", "--b", "HEAD") == 2
    assert "interrupted; no verdict" in capsys.readouterr().err and not (tmp_path / "out" / "ab.md").exists()
    assert git(repo, "worktree", "list").count("\n") == 0
