"""The docs cannot rot: the site builds in strict mode, README's report excerpt is the sample report's, no measured
figure is typed into README or a docs page, and every ``flashckpt`` command they show is one the CLI accepts."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
sys.path.insert(0, str(REPO / "tools"))
import readme_excerpt  # noqa: E402

mkdocs = pytest.importorskip("mkdocs", reason="mkdocs is in the test extra: pip install -e '.[test]'")

# A measured-looking figure: a number with a unit of memory, time, rate or ratio.
FIGURE = re.compile(
    r"(?<![\w.`/-])[~±+-]?\d[\d,]*(?:\.\d+)?"
    r"(?:\s?(?:%|x\b|×|ms\b|µs\b|us\b|s\b|min\b|[KMGT]i?B\b|TFLOP/s|GFLOP/s|GB/s|MB/s)|\sB\b)"
)


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True, text=True, cwd=config.parent, timeout=120,
    )


def test_docs_site_builds_in_strict_mode(tmp_path) -> None:
    done = _build(REPO / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "reports" / "sample" / "flashckpt-report.html").is_file()  # linked reports ship as pages


@pytest.mark.slow
def test_a_broken_link_fails_the_strict_build(tmp_path) -> None:
    """The build's power: the same site with one link to a report that does not exist fails."""
    copy = tmp_path / "repo"
    for name in ("docs", "tools", "reports", "examples", "baselines"):
        shutil.copytree(REPO / name, copy / name)
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    page = copy / "docs" / "report.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [gone](../reports/no-such-report.md).\n", encoding="utf-8")
    done = _build(copy / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-report.md" in done.stdout + done.stderr


def test_readme_excerpt_is_the_sample_reports_table() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = readme_excerpt.excerpt(readme_excerpt.SAMPLE.read_text(encoding="utf-8"))
    assert table.count("\n") >= 2, "the excerpt is a table of at least one row"
    assert readme_excerpt.render(readme, table) == readme, "README's excerpt differs: run python tools/readme_excerpt.py"


def _prose(text: str) -> str:
    """Text outside fenced code blocks, inline code, HTML comments and link targets: where a figure would be typed."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def _generated_text() -> str:
    files = [p for p in (REPO / "reports").rglob("*") if p.suffix in {".md", ".json"}]
    return "\n".join(p.read_text(encoding="utf-8") for p in files)


def figures(text: str) -> list[str]:
    return [m.group(0).strip() for m in FIGURE.finditer(_prose(text))]


def test_the_figure_finder_finds_typed_figures() -> None:
    assert figures("the step took 2 min 44 s and 41.2 MiB, saving 38.0% at 1.27x") == ["2 min", "44 s", "41.2 MiB", "38.0%", "1.27x"]
    assert figures("a 2.7B model holds 5,056 B") == ["5,056 B"]
    assert figures("run `--flashckpt-rounds 20` or\n```\n41.2 MiB\n```\n") == []


def test_no_hand_typed_figures_in_readme_or_docs() -> None:
    """Every figure in prose is held by a generated report (reports/): the docs link to numbers, never retype them."""
    generated = _generated_text()
    typed = [
        f"{page.relative_to(REPO)}: {figure!r}"
        for page in PAGES
        for figure in figures(page.read_text(encoding="utf-8"))
        if figure.lstrip("~±+") not in generated and figure not in generated
    ]
    assert not typed, (
        "figures typed into the docs that no generated file under reports/ holds (measure them with a script that "
        "writes a reports/ file and link to it, or put a setting in `code`):\n" + "\n".join(typed)
    )


def _shown_commands() -> list[tuple[str, str]]:
    shown = []
    for page in PAGES:
        for block in re.findall(r"```(?:bash|sh)\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S):
            for line in block.splitlines():
                for part in re.split(r"\s*&&\s*", line):
                    argv = shlex.split(part, comments=True)
                    if argv and Path(argv[0]).name == "flashckpt":
                        shown.append((f"{page.relative_to(REPO)}", part))
    return shown


def test_every_flashckpt_command_in_the_docs_is_accepted_by_the_cli() -> None:
    from pytest_flashckpt.cli import build_parser

    shown = _shown_commands()
    assert len(shown) >= 5
    parser = build_parser()
    for where, line in shown:
        argv = shlex.split(line, comments=True)[1:]
        try:
            parser.parse_args(argv)
        except SystemExit as exc:  # argparse's way of refusing
            pytest.fail(f"{where}: `{line}` is refused by the flashckpt parser (exit {exc.code})")
