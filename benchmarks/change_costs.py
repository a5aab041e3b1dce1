"""What the four "how to add" changes of docs/architecture.md cost, measured by making them.

    PYTHONPATH=. python benchmarks/change_costs.py [--only metric,preset,strategy,family] [--out reports/change-costs.md]

Each change (``RECIPES``: a gated metric with a report column, a save preset, an activation strategy, a model
family) is made in a temporary copy of this working tree (its tracked and untracked, not ignored, files, committed
there so ``git status`` names what the change touched). An edit whose anchor text is gone stops the run with the
file and the anchor: the recipe, and the count docs/architecture.md states, are then out of date. In the copy the
script then runs the change's focused tests unchanged (pytest, one process, no xdist) and its end-to-end check:
a one-scenario suite that uses the new name, run twice with ``flashckpt run`` (once saving a baseline into a
temporary folder, once judged against it), and where relevant ``flashckpt simulate``. The new metric's check also
doubles the metric in the baseline it is judged against (halves it: the run is then worse) and requires the gate to
say ``regressed``, so the gate provably guards it. The report lists the files each change touched, by kind (source
under ``pytest_flashckpt/``, tests, docs, data: cards, suites, reports, baselines), and every check with its exit
status and wall time; it writes its own command line. ``tests/test_change_costs.py`` checks the recipes still apply
and that docs/architecture.md states the counts they touch; its slow test runs this script.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("source", "tests", "docs", "data")


@dataclass(frozen=True)
class Edit:
    """Insert ``text`` after (or, with ``before``, before) the one occurrence of ``anchor`` in ``path``; with an
    empty anchor, ``path`` is a new file holding ``text``."""

    path: str
    text: str
    anchor: str = ""
    before: bool = False


@dataclass(frozen=True)
class Recipe:
    name: str
    title: str
    heading: str  # the paragraph of docs/architecture.md "How to add ..." that states this change's count
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]  # focused test paths, run unchanged in the copy
    scenario: str  # one suite scenario (YAML mapping lines) that uses the new name
    simulate: tuple[str, ...] = ()  # `flashckpt simulate` arguments that must succeed, if any
    expect_in_report: tuple[str, ...] = ()  # texts the run's markdown report must show
    gated_metric: str = ""  # a new gated metric: the gate must judge it and fail when the baseline is tampered
    notes: str = ""

    def files(self) -> list[str]:
        return sorted({e.path for e in self.edits})


def kind_of(path: str) -> str:
    if path.startswith("pytest_flashckpt/"):
        return "source"
    if path.startswith("tests/"):
        return "tests"
    if path.startswith("docs/") or path in ("README.md", "mkdocs.yml"):
        return "docs"
    if path.startswith(("models/", "suites/", "reports/", "baselines/")):
        return "data"
    return "other"


def counts(files: list[str]) -> dict[str, int]:
    out = {kind: 0 for kind in KINDS}
    for path in files:
        out[kind_of(path)] = out.get(kind_of(path), 0) + 1
    return out


def claim(files: list[str]) -> str:
    """The count as docs/architecture.md states it: "3 source, 0 tests, 0 docs, 0 data"."""
    c = counts(files)
    return ", ".join(f"{c[kind]} {kind}" for kind in KINDS) + (f", {c['other']} other" if c.get("other") else "")


METRIC = Recipe(
    "metric", "a gated save metric `bytes_per_file` with a column in the report's checkpoint I/O table",
    "**A metric**",
    (
        Edit("pytest_flashckpt/core/metrics.py", anchor='fmt="count", per_save=True),\n', text=(
            '    Metric("bytes_per_file", "B", "exact", "bytes one save writes per file", gated=True, slack=1e-4, '
            'fmt="mib"),\n')),
        Edit("pytest_flashckpt/checkpoint/measure.py", anchor="        out.record(name, middle, samples=values)\n",
             text=('    written, files = out.get("bytes_written"), out.get("files")\n'
                   '    out.record("bytes_per_file", int(written // files) if written is not None and files else None)\n')),
        Edit("pytest_flashckpt/report/checkpoint_io.py", anchor='"files", ', text='"per file", '),
        Edit("pytest_flashckpt/report/checkpoint_io.py", anchor='count(r.number("files")), ',
             text='mib(r.number("bytes_per_file")), '),
    ),
    tests=("tests/test_metrics.py", "tests/report", "tests/baselines", "tests/checkpoint/test_ckpt_measure.py",
           "tests/test_docs.py"),
    scenario="measure: [memory, checkpoint]\n    checkpoint: {strategy: sync, saves: 2, time_lost_rounds: 0}",
    expect_in_report=("| per file ",),
    gated_metric="bytes_per_file",
    notes="the committed sample report is not regenerated: tests/report/test_report_sample.py tolerates the new "
          "column, shown absent for a sample measured before the metric existed",
)

PRESET = Recipe(
    "preset", "a save preset `layerwise_async` (layer-wise files written in the background) and its scenario",
    "**A save strategy**",
    (
        Edit("pytest_flashckpt/core/registry.py", anchor='        SavePreset("scheduled",', before=True, text=(
            '        SavePreset("layerwise_async", "layerwise", "background", "every", '
            '"one file per block plus the rest, written by a background thread"),\n')),
        Edit("suites/checkpoint.yaml", anchor="  - name: save-scheduled\n", before=True, text=(
            "  - name: save-layerwise-async\n"
            "    description: layer-wise files written by a background thread, six saves\n"
            "    checkpoint: {strategy: layerwise_async, save_interval: 1, wait_for_write: true, saves: 6}\n")),
    ),
    tests=("tests/config", "tests/checkpoint/test_ckpt_measure.py", "tests/checkpoint/test_ckpt_axes.py",
           "tests/baselines/test_fingerprint_gate.py", "tests/test_docs.py"),
    scenario="measure: [checkpoint]\n    checkpoint: {strategy: layerwise_async, save_interval: 1, saves: 2, "
             "time_lost_rounds: 0}",
    expect_in_report=("layerwise_async",),
    notes="pick axes no scenario already names by its axes (docs/architecture.md); docs/checkpoints.md's preset "
          "table is documentation no test requires. The gate lists the new scenario as not in the baseline until the "
          "profile's baseline is next saved, and suites/default.yaml includes suites/checkpoint.yaml: the scenario's "
          "saves add to the default suite's run time",
)

STRATEGY = Recipe(
    "strategy", "an activation strategy `first_half` (the first half of the blocks recomputed) and its test",
    "**An activation strategy**",
    (
        Edit("pytest_flashckpt/core/registry.py", anchor='    ActivationStrategySpec("every_k",', before=True, text=(
            '    ActivationStrategySpec("first_half", "the first half of the blocks recomputed", '
            'f"{_PLANS}:recompute_first_half"),\n')),
        Edit("pytest_flashckpt/activation/plan.py", anchor="def selective_op_blocks(", before=True, text=(
            "def recompute_first_half(config: ActivationConfig, n_blocks: int, context: PlanContext) -> list[BlockOption]:\n"
            '    """``first_half``: blocks 0 .. n/2 - 1 recomputed, the rest kept."""\n'
            "    return [FULL if i < n_blocks // 2 else NONE for i in range(n_blocks)]\n\n\n")),
        Edit("tests/activation/test_first_half.py", text=(
            '"""first_half recomputes the first half of the blocks: its plan, and the FLOPs it adds."""\n\n'
            "from pytest_flashckpt.activation import apply_ac\n"
            "from pytest_flashckpt.activation.expected_flops import expected_matmul_flops\n"
            "from pytest_flashckpt.activation.flops import measure_step_flops\n"
            "from pytest_flashckpt.config.scenario import ActivationConfig\n"
            "from pytest_flashckpt.models import build_model, load_card\n\n\n"
            "def test_first_half_recomputes_the_first_half_of_the_blocks():\n"
            '    card = load_card("tiny", vocab_size=64, n_embd=32, n_head=2, block_size=32)\n'
            '    model = build_model(card, "sdpa")\n'
            '    assert list(apply_ac(model, ActivationConfig(strategy="first_half")).blocks) == [0, 1]\n'
            '    measured = measure_step_flops(model, 2, 16).matmul_flops\n'
            '    assert measured == expected_matmul_flops(card, 2, 16, "first_half")\n'
            '    assert expected_matmul_flops(card, 2, 16, "none") < measured < expected_matmul_flops(card, 2, 16, "full")\n')),
    ),
    tests=("tests/activation/test_first_half.py", "tests/activation/test_plan.py", "tests/config",
           "tests/registry", "tests/simulate/test_simulate_cli.py", "tests/test_docs.py"),
    scenario="measure: [memory]\n    activation: {strategy: first_half}",
    simulate=("--model", "tiny", "--seq", "64", "--batch", "2", "--dtype", "fp32", "--target", "cpu", "--kernel",
              "sdpa", "--strategy", "first_half"),
    expect_in_report=("first_half",),
)

_PICO_CARD = '''"""The pico family's card: a GPT whose card uses the neutral names as its keys."""

from dataclasses import dataclass

from pytest_flashckpt.config.cards.gpt import GPTConfig


@dataclass(frozen=True)
class PicoConfig:
    name: str = "custom"
    description: str = ""
    family: str = "pico"
    vocab_size: int = 256
    num_blocks: int = 2
    width: int = 64
    num_heads: int = 2
    max_seq_len: int = 128
    dropout: float = 0.0
    allocate_on_cpu: bool = True

    def __post_init__(self) -> None:
        if self.width % self.num_heads:
            raise ValueError(f"card {self.name!r}: width {self.width} is not a multiple of num_heads {self.num_heads}")

    @property
    def mlp_width(self) -> int:
        return 4 * self.width

    def gpt(self) -> GPTConfig:
        return GPTConfig(name=self.name, vocab_size=self.vocab_size, block_size=self.max_seq_len,
                         n_layer=self.num_blocks, n_head=self.num_heads, n_embd=self.width, dropout=self.dropout)

    def num_params(self) -> int:
        return self.gpt().num_params()


CARD = PicoConfig
'''
_PICO_FAMILY = '''"""The pico family: GPT blocks under a card with neutral names."""

from dataclasses import replace

from pytest_flashckpt.config.cards.pico import PicoConfig
from pytest_flashckpt.models.families import Family, register_family
from pytest_flashckpt.models.gpt import GPT, GPT_ANATOMY

ANATOMY = replace(GPT_ANATOMY, family="pico")


class Pico(GPT):
    def anatomy(self):
        return ANATOMY


FAMILY = register_family(Family(name="pico", card=PicoConfig, build=lambda card, backend: Pico(card.gpt(), backend),
                                anatomy=lambda card: ANATOMY))
'''

FAMILY = Recipe(
    "family", "a model family `pico` (GPT blocks, a card with the neutral names), a card and its test",
    "**A model family**",
    (
        Edit("pytest_flashckpt/config/cards/pico.py", text=_PICO_CARD),
        Edit("pytest_flashckpt/models/pico/__init__.py", text='"""The pico family (family.py registers it)."""\n'),
        Edit("pytest_flashckpt/models/pico/family.py", text=_PICO_FAMILY),
        Edit("models/pico-tiny.yaml", text="name: pico-tiny\nfamily: pico\nnum_blocks: 3\nwidth: 64\nnum_heads: 2\n"),
        Edit("tests/models/test_pico.py", text=(
            '"""The pico family registers itself, builds from its card and trains."""\n\n'
            "from pytest_flashckpt.models import build_model, families, load_card\n\n\n"
            "def test_pico_builds_from_its_card():\n"
            '    assert "pico" in families.families()\n'
            '    model = build_model(load_card("pico-tiny"), "sdpa")\n'
            '    assert type(model).__name__ == "Pico" and len(model.blocks) == 3 and model.anatomy().family == "pico"\n')),
    ),
    tests=("tests/models/test_pico.py", "tests/models/test_anatomy.py", "tests/models/test_gpt.py", "tests/config",
           "tests/registry", "tests/test_layers.py", "tests/test_docs.py"),
    scenario="model: pico-tiny\n    measure: [memory]\n    activation: {strategy: full}",
    simulate=("--model", "pico-tiny", "--seq", "64", "--batch", "2", "--dtype", "fp32", "--target", "cpu",
              "--kernel", "sdpa", "--strategy", "full"),
    expect_in_report=("pico-tiny",),
)

RECIPES = {r.name: r for r in (METRIC, PRESET, STRATEGY, FAMILY)}


class RecipeStale(Exception):
    pass


def apply(recipe: Recipe, root: Path) -> None:
    """Make the recipe's edits under ``root``; ``RecipeStale`` naming the file and anchor that no longer match."""
    for edit in recipe.edits:
        path = root / edit.path
        if not edit.anchor:
            if path.exists():
                raise RecipeStale(f"{recipe.name}: {edit.path} already exists; the recipe adds it")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(edit.text, encoding="utf-8")
            continue
        text = path.read_text(encoding="utf-8") if path.is_file() else ""
        if text.count(edit.anchor) != 1:
            raise RecipeStale(f"{recipe.name}: {edit.path} has {text.count(edit.anchor)} occurrences of "
                              f"{edit.anchor!r} (the recipe needs exactly one): update RECIPES in "
                              "benchmarks/change_costs.py and the count in docs/architecture.md")
        at = text.index(edit.anchor) + (0 if edit.before else len(edit.anchor))
        path.write_text(text[:at] + edit.text + text[at:], encoding="utf-8")


def copy_tree(dest: Path) -> None:
    """This working tree's tracked and untracked (not ignored) files, committed in a fresh repository at ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    git = ["git", "-c", "user.name=change-costs", "-c", "user.email=change-costs@localhost"]
    subprocess.run([*git, "init", "-q"], cwd=dest, check=True)
    subprocess.run([*git, "add", "-A"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "before"], cwd=dest, check=True)


def touched(root: Path) -> list[str]:
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=root, check=True,
                         capture_output=True, text=True).stdout
    return sorted(line[3:] for line in out.splitlines())


@dataclass
class Check:
    what: str
    command: list[str]
    rc: int
    wall_s: float
    tail: str
    ok: bool


def run(what: str, command: list[str], cwd: Path, env: dict[str, str], ok=lambda rc, out: rc == 0) -> Check:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    out = done.stdout + done.stderr
    return Check(what, command, done.returncode, time.perf_counter() - start, out[-1500:], ok(done.returncode, out))


def _kinds(copy: Path, env: dict[str, str]) -> dict[str, str]:
    """Each metric's kind in the copy's vocabulary (the copy may have rows this process's does not)."""
    code = "import json; from pytest_flashckpt.core.metrics import METRICS; print(json.dumps({n: m.kind for n, m in METRICS.items()}))"
    return json.loads(subprocess.run([sys.executable, "-c", code], cwd=copy, env=env, check=True, capture_output=True,
                                     text=True).stdout)


def end_to_end(recipe: Recipe, copy: Path, work: Path, env: dict[str, str]) -> list[Check]:
    """A one-scenario suite using the new name through ``flashckpt run`` (baseline saved, then judged), the report's
    texts, ``flashckpt simulate`` where given, and for a gated metric the gate failing on a tampered baseline."""
    suite = work / "scratch.yaml"
    scenario = recipe.scenario if recipe.scenario.startswith("model:") else "model: tiny\n    " + recipe.scenario
    suite.write_text("name: scratch\nscenarios:\n  - name: change\n    " + scenario +
                     "\n    batch_size: 2\n    seq_len: 32\n    rounds: 1\n    steps: 1\n    warmup: 1\n")
    flashckpt = [sys.executable, "-m", "pytest_flashckpt.cli"]
    base = [*flashckpt, "run", "--suite", str(suite), "--baseline-dir", str(work / "baselines")]
    checks = [run("flashckpt run, saving a baseline", [*base, "--report", str(work / "first"), "--save-baseline"],
                  copy, env)]
    report = (work / "first" / "flashckpt-report.md")
    text = report.read_text(encoding="utf-8") if report.is_file() else ""
    for expected in recipe.expect_in_report:
        checks.append(Check(f"the report shows {expected.strip()!r}", [], 0, 0.0, "", expected in text))
    checks.append(run("flashckpt run, judged against that baseline", [*base, "--report", str(work / "second")], copy,
                      env))
    record = work / "second" / "results.json"
    verdicts = json.loads(record.read_text())["comparison"]["verdicts"] if record.is_file() else []
    kinds = _kinds(copy, env)
    exact = [v for v in verdicts if kinds.get(v["metric"]) == "exact"]
    checks.append(Check("the gate judged the scenario: a verdict row per gated metric, none missing, exact ones ok", [],
                        0, 0.0, json.dumps(verdicts)[-1400:],
                        bool(verdicts) and not any(v["verdict"] == "missing" for v in verdicts)
                        and all(v["verdict"] == "ok" for v in exact)))
    if recipe.gated_metric:
        name = recipe.gated_metric
        first = work / "first" / "results.json"
        values = [r["metrics"].get(name) for r in json.loads(first.read_text())["results"]] if first.is_file() else []
        checks.append(Check(f"the run recorded {name}", [], 0, 0.0, json.dumps(values),
                            bool(values) and all(isinstance(v, (int, float)) and v > 0 for v in values)))
        rows = [v for v in verdicts if v["metric"] == name]
        checks.append(Check(f"the gate judged {name}", [], 0, 0.0, json.dumps(rows), [v["verdict"] for v in rows] == ["ok"]))
        for stored in (work / "baselines").glob("*.json"):
            data = json.loads(stored.read_text())
            for entry in data["scenarios"].values():
                entry["metrics"][name] = entry["metrics"][name] / 2  # this run writes twice the baseline's
            stored.write_text(json.dumps(data))
        tampered = run(f"flashckpt run against a baseline with {name} halved (control: must fail)",
                       [*base, "--report", str(work / "third")], copy, env, ok=lambda rc, out: rc != 0)
        third = work / "third" / "results.json"
        rows = [v for v in json.loads(third.read_text())["comparison"]["verdicts"] if v["metric"] == name] if third.is_file() else []
        tampered.ok = tampered.ok and [v["verdict"] for v in rows] == ["regressed"]
        tampered.tail += f"\n{name} verdicts: {json.dumps(rows)}"
        checks.append(tampered)
    if recipe.simulate:
        checks.append(run("flashckpt simulate", [*flashckpt, "simulate", *recipe.simulate], copy, env))
    return checks


def measure(recipe: Recipe, keep: bool) -> tuple[list[str], list[Check], Path]:
    """The files the recipe touched in a fresh copy, and its checks (commands shown with $COPY and $WORK)."""
    folder = Path(tempfile.mkdtemp(prefix=f"change-costs-{recipe.name}-"))
    copy, work = folder / "copy", folder / "work"
    copy.mkdir()
    work.mkdir()
    copy_tree(copy)
    apply(recipe, copy)
    files = touched(copy)
    expected = recipe.files()
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    pytest = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:xdist", "-p", "no:cacheprovider", *recipe.tests]
    checks = [Check("git status names exactly the recipe's files", [], 0, 0.0, f"touched {files}, recipe {expected}",
                    files == expected),
              run("focused tests, unchanged", pytest, copy, env), *end_to_end(recipe, copy, work, env)]
    for c in checks:
        c.command = [a.replace(str(work), "$WORK").replace(str(copy), "$COPY") for a in c.command]
    if not keep:
        shutil.rmtree(folder, ignore_errors=True)
    return files, checks, folder


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def report(results: dict[str, tuple[list[str], list[Check]]], argv: list[str], out: Path) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    status = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    own = out.resolve().relative_to(ROOT).as_posix() if out.resolve().is_relative_to(ROOT) else None
    dirty = [line for line in status.splitlines() if line[3:] != own]  # the report being rewritten is not a change
    lines = [
        "# What a change costs: the four \"how to add\" changes, made",
        "",
        f"Generated by `{' '.join(shlex.quote(a) for a in argv)}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC "
        f"from commit {commit}{' with uncommitted changes' if dirty else ''} (benchmarks/change_costs.py: each change "
        "made in a temporary copy of the tree, its focused tests run there unchanged, then a one-scenario suite that "
        "uses the new name run with `flashckpt run` twice, saving a baseline and judged against it; `$COPY` is the copy, "
        "`$WORK` a temporary folder beside it, both removed afterwards).",
        "",
        "| change | files touched (source, tests, docs, data) | checks passed | the files |",
        "| --- | --- | --- | --- |",
    ]
    for name, (files, checks) in results.items():
        passed = sum(c.ok for c in checks)
        lines.append(f"| {name}: {RECIPES[name].title} | {claim(files)} | {passed} of {len(checks)} | "
                     f"{', '.join(f'`{f}`' for f in files)} |")
    for name, (files, checks) in results.items():
        recipe = RECIPES[name]
        lines += ["", f"## {name}: {recipe.title}", ""]
        if recipe.notes:
            lines += [recipe.notes[0].upper() + recipe.notes[1:] + ".", ""]
        lines += ["| check | command | exit | wall | passed |", "| --- | --- | ---: | ---: | --- |"]
        for c in checks:
            shown = " ".join(c.command).replace(sys.executable, "python")
            lines.append(f"| {_cell(c.what)} | {'`' + _cell(shown) + '`' if shown else ''} | {c.rc if c.command else ''} "
                         f"| {f'{c.wall_s:.1f} s' if c.command else ''} | {'yes' if c.ok else '**no**'} |")
        failed = [c for c in checks if not c.ok]
        for c in failed:
            lines += ["", f"`{c.what}` failed; its output's end:", "", "```", c.tail.strip(), "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(RECIPES), help="comma-separated changes (default: all)")
    parser.add_argument("--out", default="reports/change-costs.md", help="report path (relative to the repository)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copies (their paths are printed)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.only.split(",") if n not in RECIPES]
    if unknown:
        parser.error(f"--only {','.join(unknown)}: no such change; choose from {', '.join(RECIPES)}")
    results = {}
    for name in args.only.split(","):
        files, checks, folder = measure(RECIPES[name], args.keep)
        results[name] = (files, checks)
        print(f"{name}: {claim(files)}; {sum(c.ok for c in checks)} of {len(checks)} checks passed"
              + (f" ({folder})" if args.keep else ""), flush=True)
    out = ROOT / args.out
    out.write_text(report(results, ["python", "benchmarks/change_costs.py", *(argv if argv is not None else sys.argv[1:])],
                          out), encoding="utf-8")
    print(f"report: {out}")
    return 0 if all(c.ok for _, checks in results.values() for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
