"""The plugin as a user meets it, through pytester: options, collection and -k, skip reasons, written
results, bad configuration, and zero cost when no suite is asked for.

One suite run is a pytest subprocess end to end (the entry point, real measurements, kernel detection and skip
reasons); the others run pytest in this process (``runpytest_inprocess``: torch is imported once), with a fake
measurement (``fake_runner``, tests/conftest.py) where no training step is needed."""

import json
import textwrap

import pytest

TINY_SUITE = """
name: mini
defaults: {model: tiny, batch_size: 1, seq_len: 32, rounds: 2, measure: [memory, timing]}
scenarios:
  - name: "{attention}-s{seq_len}"
    matrix: {attention: [eager, sdpa, flash_attn], seq_len: [32]}
  - name: too-big
    model: gpt3-2.7b
    seq_len: 32
"""


@pytest.fixture
def suite_file(pytester):
    return pytester.makefile(".yaml", mini=TINY_SUITE)


def test_help_lists_the_options_group_with_defaults(pytester):
    result = pytester.runpytest_inprocess("--help")
    result.stdout.fnmatch_lines(
        [
            "*pytest-flashckpt: measure checkpointing strategies*",
            "*--flashckpt-suite=*NAME|PATH*",
            "*--flashckpt-device=DEVICE*",
            "*cuda:N (default: auto)*",
            "*--flashckpt-report=*",
            "*flashckpt_device (string):*",
        ]
    )


@pytest.mark.slow
def test_suite_runs_skips_with_reasons_and_writes_results(pytester, suite_file):
    result = pytester.runpytest_subprocess(f"--flashckpt-suite={suite_file}", "--flashckpt-device=cpu", "-rs", "--flashckpt-report=out")
    result.assert_outcomes(passed=2, skipped=2)
    result.stdout.fnmatch_lines(
        [
            "*mini::eager-s32: kernel eager, peak *MiB*",
            "*mini::sdpa-s32: kernel sdpa-flash-cpu*",
            "*flash-attn is not installed*",
            "*gpt3-2.7b* is only built on the meta device on a CPU; run it on a GPU*",
        ]
    )
    data = json.loads((pytester.path / "out" / "results.json").read_text())
    assert data["schema_version"] == 2 and data["suite"] == "mini"
    by_id = {f"{r['suite']}::{r['scenario']}": r for r in data["results"]}
    assert by_id["mini::sdpa-s32"]["status"] == "measured"
    assert by_id["mini::sdpa-s32"]["metrics"]["peak_bytes"] > by_id["mini::sdpa-s32"]["metrics"]["state_bytes"] > 0
    assert len(by_id["mini::sdpa-s32"]["samples"]["step_time_s"]) == 2
    assert by_id["mini::flash_attn-s32"]["status"] == "skipped"
    assert "flash-attn" in by_id["mini::flash_attn-s32"]["reason"]
    report = (pytester.path / "out" / "flashckpt-report.md").read_text()
    assert "mini::too-big" in report and "only built on the meta device" in report


def test_k_selects_scenarios_and_collect_only_lists_ids(pytester, suite_file):
    result = pytester.runpytest_inprocess(f"--flashckpt-suite={suite_file}", "--flashckpt-device=cpu", "--collect-only", "-q", "-k", "sdpa")
    result.stdout.fnmatch_lines(["mini::sdpa-s32", "*1/4 tests collected (3 deselected)*"])
    assert not (pytester.path / "flashckpt-report").exists()


def test_the_suite_alone_without_paths_and_beside_the_tests_of_given_paths(pytester, suite_file, fake_runner):
    """No test paths: the suite is the whole collection, nothing else is even imported (a broken test file stays
    unread); with a path, the scenarios join its tests in pytest's own collection count and line layout."""
    pytester.makepyfile(test_broken="raise RuntimeError('imported although only the suite was asked for')")
    alone = pytester.runpytest_inprocess(f"--flashckpt-suite={suite_file}", "-k", "sdpa")
    alone.assert_outcomes(passed=1)
    alone.stdout.fnmatch_lines(["collected 4 items / 3 deselected / 1 selected"])
    pytester.makepyfile(test_fine="def test_a():\n    pass\n")
    beside = pytester.runpytest_inprocess(f"--flashckpt-suite={suite_file}", "-k", "sdpa or test_a", "test_fine.py")
    beside.assert_outcomes(passed=2)
    beside.stdout.fnmatch_lines(["collected 5 items / 3 deselected / 2 selected", "test_fine.py .*", "mini ", "mini::sdpa-s32: *"])


def test_default_report_folder_is_self_ignoring_a_named_one_is_not(pytester, suite_file, fake_runner):
    pytester.runpytest_inprocess(f"--flashckpt-suite={suite_file}", "-k", "sdpa").assert_outcomes(passed=1)
    default = pytester.path / "flashckpt-report"
    assert (default / "results.json").is_file() and (default / "flashckpt-report.md").is_file()
    assert (default / ".gitignore").read_text().splitlines()[-1] == "*"
    pytester.runpytest_inprocess(f"--flashckpt-suite={suite_file}", "-k", "sdpa", "--flashckpt-report=mine").assert_outcomes(passed=1)
    assert (pytester.path / "mine" / "results.json").is_file() and not (pytester.path / "mine" / ".gitignore").exists()


def test_ini_twin_sets_the_report_folder(pytester, suite_file, fake_runner):
    pytester.makeini("[pytest]\nflashckpt_report = from-ini\n")
    result = pytester.runpytest_inprocess(f"--flashckpt-suite={suite_file}", "--flashckpt-device=cpu", "-k", "sdpa")
    result.assert_outcomes(passed=1, deselected=3)
    assert (pytester.path / "from-ini" / "results.json").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--flashckpt-device=tpu"], "*--flashckpt-device: 'tpu' is not valid: valid: auto, cpu, cuda, cuda:N*"),
        (["--flashckpt-probe=gpu"], "*--flashckpt-probe: 'gpu' is not valid; valid: auto, cpu, cuda, nvml, rss*"),
        (["--flashckpt-suite=nope"], "*unknown suite 'nope'*valid names:*default*"),
        (["--flashckpt-suite", "--flashckpt-rounds=-3"], "*--flashckpt-rounds: '-3' is not valid: must be 0 (as the suite says) or a positive*"),
        (["--flashckpt-rounds=three"], "*--flashckpt-rounds: 'three' is not valid*"),
    ],
)
def test_bad_options_are_usage_errors(pytester, args, message):
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_bad_suite_is_a_usage_error_and_writes_nothing(pytester):
    bad = pytester.makefile(".yaml", bad="scenarios:\n  - name: a\n    model: tiny\n  - name: b\n    model: tiny\n    activation: {strategy: every_k, k: 7}\n")
    result = pytester.runpytest_inprocess(f"--flashckpt-suite={bad}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: flashckpt: bad.yaml: scenario 'b': activation.k: 7 is larger than the 4 blocks of 'tiny' (valid: 1..4)"])
    assert not (pytester.path / "flashckpt-report").exists()


@pytest.mark.slow
def test_plugin_costs_nothing_without_a_suite(pytester):
    """A project with the plugin installed but no suite asked for never imports torch."""
    pytester.makepyfile(
        test_plain=textwrap.dedent(
            """
            import sys

            def test_plain():
                assert "torch" not in sys.modules
                assert "pytest_flashckpt.plugin.hooks" in sys.modules
            """
        )
    )
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1)


def test_a_scenario_that_breaks_fails_its_item_and_keeps_its_row(pytester):
    """A strategy that cannot work on this model (a save op that never runs) fails with the reason; the other
    scenarios still run and the results file records the error. Memory only: the save op is found missing in the
    warm-up step, before any measurement pass; the timing, FLOP and roofline passes add nothing checked here."""
    suite = pytester.makefile(
        ".yaml",
        broken="""
defaults: {model: tiny, batch_size: 1, seq_len: 32, rounds: 1, attention: sdpa, measure: [memory]}
scenarios:
  - name: fine
  - name: broken
    activation: {strategy: selective_op, save_ops: [aten.cholesky.default]}
""",
    )
    result = pytester.runpytest_inprocess(f"--flashckpt-suite={suite}", "--flashckpt-device=cpu", "--flashckpt-report=out")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*broken::broken: RuntimeError: *"])
    data = json.loads((pytester.path / "out" / "results.json").read_text())
    statuses = {r["scenario"]: r["status"] for r in data["results"]}
    assert statuses == {"fine": "measured", "broken": "error"}


GPU_SMOKE_SUITE = """
name: gpu-smoke
defaults: {model: tiny, dtype: bfloat16, batch_size: 2, seq_len: 256, measure: [memory, timing], rounds: 1, warmup: 1}
scenarios:
  - name: reference
    attention: auto
  - name: selective
    attention: auto
    activation: {strategy: selective_op}
"""


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device; this machine has none")
def test_auto_device_on_a_gpu_runs_cuda_with_the_cuda_probe_and_a_gpu_profile(pytester):
    import importlib.util
    import json

    suite = pytester.makefile(".yaml", smoke=GPU_SMOKE_SUITE)
    result = pytester.runpytest_subprocess(f"--flashckpt-suite={suite}", "--flashckpt-report=out", "-p", "no:benchmark")
    result.assert_outcomes(passed=2)
    record = json.loads((pytester.path / "out" / "results.json").read_text())
    assert record["device"].startswith("cuda:") and record["probe"] == "cuda"
    assert not record["profile_id"].startswith("cpu-")
    if importlib.util.find_spec("flash_attn") is not None:
        assert record["profile"]["kernel"] == "flash_attn"
        assert {r["kernel"] for r in record["results"]} == {"flash_attn"}
