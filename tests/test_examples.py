"""The documented examples run and show what they claim."""

import runpy
from pathlib import Path

import pytest
import torch

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.config.scenario import ActivationConfig

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _example() -> dict:
    return runpy.run_path(str(EXAMPLES / "any_module.py"))


@pytest.mark.parametrize("with_anatomy", [False, True])
@pytest.mark.parametrize("strategy", ["full", "selective_op"])
def test_any_module_strategies_give_bitwise_gradients(strategy, with_anatomy):
    """The example's model (blocks under ``layers``, a keyword argument per block) without and with an anatomy."""
    example = _example()
    reference_loss, reference = example["gradients"](example["build"](with_anatomy))
    model = example["build"](with_anatomy)
    apply_ac(model, ActivationConfig(strategy=strategy), blocks=None if with_anatomy else "layers")
    loss, grads = example["gradients"](model)
    assert torch.equal(loss, reference_loss)
    assert all(torch.equal(grads[name], reference[name]) for name in reference)


@pytest.mark.slow
def test_any_module_example_every_strategy_bitwise_and_the_budget_plan_fits(capsys):
    results = _example()["main"]()
    assert len(results) == 8
    assert all(row["bitwise"] for row in results.values()), results
    for key in ("budget (blocks=)", "budget (anatomy)"):
        assert results[key]["peak"] <= results[key]["budget"]
    # without an anatomy the planner has whole-block options only; with one it may save by role
    assert set(results["budget (blocks=)"]["options"]) <= {"none", "full"}
    assert "bitwise=True" in capsys.readouterr().out


WORKFLOW = EXAMPLES / "ci" / "gpu-runner.yml"
FAKE_SHA = {"BASE": "a" * 40, "HEAD_SHA": "b" * 40}


def _ab_invocation(script: str) -> list[str]:
    """The ``flashckpt ab`` command line of a run script, its ``$VAR`` references replaced by FAKE_SHA's values."""
    import re
    import shlex

    line = next((line for line in script.replace("\\\n", " ").splitlines() if re.search(r'flashckpt"? ab ', line)), None)
    if line is None:
        return []
    tokens = shlex.split(line, comments=True)
    start = next(i for i, token in enumerate(tokens) if token == "ab" and tokens[i - 1].endswith("flashckpt"))
    return [re.sub(r"\$(\w+)", lambda m: FAKE_SHA.get(m.group(1), "/tmp/" + m.group(1)), t) for t in tokens[start:]]


def workflow_problems(text: str) -> list[str]:
    """What makes the CI example unsafe for a self-hosted runner or not an A/B gate of SHAs (empty when none)."""
    import yaml

    from pytest_flashckpt.cli import build_parser

    data = yaml.safe_load(text)
    problems = []
    triggers = data.get("on", data.get(True))  # YAML 1.1 reads the key `on` as True
    triggers = [triggers] if isinstance(triggers, str) else list(triggers)
    if "pull_request" not in triggers:
        problems.append("not triggered by pull_request")
    if "pull_request_target" in triggers:
        problems.append("pull_request_target (the base's secrets and a write token for the head's code)")
    if data.get("permissions") != {"contents": "read"}:
        problems.append(f"workflow permissions {data.get('permissions')!r}, not just contents: read")
    steps = {}
    for name, job in data["jobs"].items():
        runs_on = job.get("runs-on", [])
        permissions = job.get("permissions", data.get("permissions")) or {}
        if "self-hosted" in runs_on and any(value != "read" for value in permissions.values()):
            problems.append(f"job {name} runs pull-request code on the self-hosted runner with {permissions!r}")
        for step in job.get("steps", []):
            steps[step.get("id") or step.get("name") or step.get("uses")] = (name, step)
            if "actions/checkout" in step.get("uses", "") and (step.get("with") or {}).get("persist-credentials") is not False:
                problems.append(f"job {name}: a checkout without persist-credentials: false")
            if "${{" in step.get("run", ""):
                problems.append(f"job {name}, step {step.get('name')!r}: an expression inside a run script (use env:)")
    refs = steps.get("refs", (None, {}))[1]
    env = refs.get("env") or {}
    if (env.get("BASE_TIP") != "${{ github.event.pull_request.base.sha }}"
            or env.get("HEAD_SHA") != "${{ github.event.pull_request.head.sha }}"
            or 'BASE=$(git merge-base "$BASE_TIP" "$HEAD_SHA")' not in refs.get("run", "")
            or 'echo "base=$BASE"' not in refs.get("run", "")):
        problems.append("no step `refs` computing the base as git merge-base of the base and head SHAs")
    invocations = [(name, step, _ab_invocation(step.get("run", ""))) for name, step in steps.values()]
    invocations = [found for found in invocations if found[2]]
    if len(invocations) != 1:
        return problems + [f"{len(invocations)} `flashckpt ab` invocations, not one"]
    job, step, argv = invocations[0]
    if "self-hosted" not in data["jobs"][job].get("runs-on", []):
        problems.append("flashckpt ab does not run on the self-hosted GPU runner")
    if (step.get("env") or {}) != {"BASE": "${{ steps.refs.outputs.base }}", "HEAD_SHA": "${{ steps.refs.outputs.head }}"}:
        problems.append(f"flashckpt ab's env {step.get('env')!r} is not the refs step's SHAs")
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:
        return problems + [f"flashckpt {' '.join(argv)}: the parser refuses it"]
    if (args.a, args.b) != (FAKE_SHA["BASE"], FAKE_SHA["HEAD_SHA"]):
        problems.append(f"flashckpt ab --a {args.a or args.a_path} --b {args.b or args.b_path}: not the two SHAs")
    if args.suite_from != "a":
        problems.append(f"--suite-from {args.suite_from}: the pull request would pick the suite that gates it")
    if 'cd "$RUNNER_TEMP/flashckpt-base"' not in step["run"]:
        problems.append("flashckpt ab does not run from the merge base's tree")
    if not any("ab.md" in s.get("run", "") and "gh pr comment" in s.get("run", "") for _, s in steps.values()):
        problems.append("ab.md is not commented on the pull request")
    if not any("upload-artifact" in s.get("uses", "") and "flashckpt-ab" in str(s.get("with")) for _, s in steps.values()):
        problems.append("ab.md is not uploaded")
    return problems


def test_the_ci_example_gates_pull_requests_with_ab_safely():
    assert workflow_problems(WORKFLOW.read_text()) == []


@pytest.mark.parametrize("old, new", [
    ("  pull_request:\n", "  pull_request_target:\n"),
    ("persist-credentials: false", "persist-credentials: true"),
    ("    permissions:\n      contents: read\n    env:", "    permissions:\n      contents: write\n    env:"),
    ("--suite-from a", "--suite-from here"),
    ('--a "$BASE"', "--a main"),
    ('--b "$HEAD_SHA"', "--b-path ."),
    ('BASE=$(git merge-base "$BASE_TIP" "$HEAD_SHA")', 'BASE="$BASE_TIP"'),
    ('echo "head=$HEAD_SHA" >>', 'echo "head=${{ github.event.pull_request.head.sha }}" >>'),
    ("--rounds 6", "--rounds 6 --no-such-option"),
    ('cd "$RUNNER_TEMP/flashckpt-base"  #', "#"),
])
def test_each_unsafe_edit_of_the_ci_example_is_caught(old, new, capsys):
    """The control: each edit (present in the file, so the replacement bites) turns the check red."""
    text = WORKFLOW.read_text()
    assert old in text
    assert workflow_problems(text.replace(old, new)), new
