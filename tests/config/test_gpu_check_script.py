"""benchmarks/gpu_check.sh can only run on a GPU; here: it parses, and the scenarios it singles out exist."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_flashckpt.config.suites import load_suite

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.sh"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_check_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_scenarios_the_check_names_are_in_the_gpu_suite():
    text = SCRIPT.read_text()
    names = {s.name for s in load_suite("gpu").scenarios}
    picked = re.findall(r"^(?:ISO|NV)=(\S+)$", text, flags=re.M)
    assert len(picked) == 2 and set(picked) <= names


def test_the_gpu_margin_check_runs_the_benchmark_within_a_small_timeout():
    text = SCRIPT.read_text()
    found = re.search(r'^check gpu-margin (\d+) "\$PY" (benchmarks/gpu_margin\.py) --out "\$OUT"', text, flags=re.M)
    assert found, "gpu_check.sh has no gpu-margin check"
    assert int(found.group(1)) <= 120  # the whole check is budgeted at 10 minutes
    assert (SCRIPT.parents[1] / found.group(2)).is_file()


def test_example_gpu_workflow_installs_the_gpu_stack_and_gates_with_ab():
    import yaml

    workflow = yaml.safe_load((SCRIPT.parents[1] / "examples" / "ci" / "gpu-runner.yml").read_text())
    job = workflow["jobs"]["ab"]
    steps = job["steps"]
    runs = "\n".join(step.get("run", "") for step in steps)
    assert "self-hosted" in job["runs-on"] and "gpu" in job["runs-on"]
    assert "-c constraints.txt" in runs and "torch==2.13.0" in runs and "flash-attn>=2.7" in runs
    assert "flashckpt\" ab" in runs  # the A/B gate, not two suite runs compared afterwards
    assert any(step.get("uses", "").startswith("actions/upload-artifact") for step in steps)
    assert "gh pr comment" in "\n".join(step.get("run", "") for step in workflow["jobs"]["comment"]["steps"])