"""A suite run's OpenMP threads wait passively unless the user chose a policy, and only when it can still take
effect (before torch is imported: libgomp reads the variable once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from pytest_flashckpt.plugin import hooks
from pytest_flashckpt.runner.threads import WAIT_POLICY

PROBE = ("import json, os, sys\n{before}\nfrom pytest_flashckpt.runner.threads import prefer_passive_openmp\n"
         "print(json.dumps([prefer_passive_openmp(), os.environ.get('OMP_WAIT_POLICY')]))")


def _fresh(before: str = "", **env: str) -> list:
    clean = {k: v for k, v in os.environ.items() if k != WAIT_POLICY}
    out = subprocess.run([sys.executable, "-c", PROBE.format(before=before)], env={**clean, **env},
                         capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_passive_is_set_before_torch_and_never_over_the_users_choice() -> None:
    assert _fresh() == [True, "PASSIVE"]
    assert _fresh(OMP_WAIT_POLICY="ACTIVE") == [False, "ACTIVE"]  # the user's own policy stays
    assert _fresh("import torch") == [False, None]  # too late to matter: not set, and said so


def test_the_plugin_sets_it_only_for_a_suite_run(monkeypatch) -> None:
    monkeypatch.delenv(WAIT_POLICY, raising=False)
    monkeypatch.delitem(sys.modules, "torch")  # as in a process that has not imported torch yet
    hooks.pytest_load_initial_conftests(SimpleNamespace(known_args_namespace=SimpleNamespace(flashckpt_suite=None)))
    assert WAIT_POLICY not in os.environ  # plain pytest with the plugin installed: nothing changed
    hooks.pytest_load_initial_conftests(SimpleNamespace(known_args_namespace=SimpleNamespace(flashckpt_suite="default")))
    assert os.environ[WAIT_POLICY] == "PASSIVE"
