"""Shared test helpers. Hypothesis profiles: ``ci`` (default, fast) and ``deep``, chosen by the environment
variable FLASHCKPT_HYPOTHESIS_PROFILE."""

import gc
import os
import sys

import pytest

from pytest_flashckpt.runner.threads import prefer_passive_openmp

# before torch is imported: OpenMP threads of this process and its xdist workers wait passively (runner/threads.py)
OPENMP_PASSIVE = prefer_passive_openmp()

import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from fake_runner import FakeRunner  # a plain module of tests/, as fresh_python

settings.register_profile("ci", max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("FLASHCKPT_HYPOTHESIS_PROFILE", "ci"))

pytest_plugins = ["pytester"]

MAX_WORKERS = 4  # each worker imports torch and transformers and builds its own models: memory grows with workers


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _is_the_default_run(config: pytest.Config) -> bool:
    """Plain ``pytest`` in this repository (README's test command): the test paths of the ini, the ini's marker
    selection, no ``-n`` given, nothing that wants one process (``--pdb``, ``--collect-only``, a suite run)."""
    option = config.option
    return (
        getattr(option, "numprocesses", "absent") is None  # pytest-xdist is installed and -n was not given
        and config.args_source == pytest.Config.ArgsSource.TESTPATHS
        and option.markexpr == "not slow"
        and not option.keyword
        and not option.usepdb
        and not option.collectonly
        and not getattr(option, "flashckpt_suite", None)
        and "PYTEST_XDIST_WORKER" not in os.environ
    )


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """The default run spreads over pytest-xdist workers, one per core (at most ``MAX_WORKERS``): on 2 cores it
    takes about half the time of one process (docs/contributing.md, "Running the tests in parallel"). Named paths, ``-k``, ``-m slow``
    and ``-n 0`` run in one process, as pytest does by default."""
    if _is_the_default_run(config) and _cores() > 1:
        workers = min(_cores(), MAX_WORKERS)
        config.option.numprocesses = workers
        config.option.dist = "worksteal"
        # The workers share the cores: an intra-op thread pool of cores/workers each (inherited by the processes
        # their tests start), or the pools spin against each other (2 workers x 2 threads on 2 cores: 148 s;
        # 2 x 1: 101 s).
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _cores() // workers)))


def pytest_collection_finish(session: pytest.Session) -> None:
    """What exists once the tests are collected (torch, transformers, hypothesis, the test modules) lives for the
    whole run: ``gc.freeze`` moves it out of the garbage collector's reach, so the full collections a test triggers
    (the cuda and nvml probes call ``gc.collect``, and Python runs them on its own) walk only what tests made since,
    not hundreds of thousands of library objects each time. Garbage the tests make is collected as before."""
    gc.collect()
    gc.freeze()


gc.freeze()  # the same for collection itself: torch and pytest, imported by now, are not walked while it runs


@pytest.fixture(scope="session", autouse=True)
def inprocess_pytest_keeps_imported_libraries(tmp_path_factory):
    """``pytester.runpytest_inprocess`` (and each pytester test's end) restores ``sys.modules`` to a snapshot, so
    modules a run imported are imported again by the next: right for the runs' own test files, fatal for torch,
    whose lazily imported parts register operator libraries once per process (``torch._inductor.test_operators``:
    "Only a single TORCH_LIBRARY can be used to register the namespace"). Here the snapshot keeps every module but
    those loaded from the runs' temporary folders (their test files and conftests)."""
    from _pytest import pytester

    basetemp = str(tmp_path_factory.getbasetemp())

    def from_a_run(name: str) -> bool:
        return str(getattr(sys.modules.get(name), "__file__", None) or "").startswith(basetemp)

    class KeepingLibraries(pytester.SysModulesSnapshot):
        def __init__(self, preserve=None) -> None:
            super().__init__(preserve=lambda name: not from_a_run(name) or (preserve is not None and preserve(name)))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pytester, "SysModulesSnapshot", KeepingLibraries)
        yield


@pytest.fixture
def one_thread():
    """Tiny models: one intra-op thread is faster and steadier on a shared 2-core machine (modules that want it say
    ``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def fake_runner(monkeypatch) -> FakeRunner:
    """Every suite run of this test (``SuiteRun`` in this process, ``pytester.runpytest_inprocess`` included)
    measures through a ``FakeRunner`` instead of the runner the scenario asks for."""
    import pytest_flashckpt.runner.suite as suite_module

    runner = FakeRunner()
    monkeypatch.setattr(suite_module, "runner_for", lambda scenario: runner)
    return runner
