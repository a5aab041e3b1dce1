"""The ``flashckpt`` command: report, compare, claims, and clear errors (exit 2, naming the file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_flashckpt.cli import main


def test_report_rerenders_beside_the_results(results_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(results_file)]) == 0
    report = results_file.parent / "flashckpt-report.md"
    assert capsys.readouterr().out.strip() == str(report)
    assert "## The article's scenario table, measured" in report.read_text(encoding="utf-8")


def test_report_out_folder(results_file: Path, tmp_path: Path) -> None:
    assert main(["report", str(results_file), "--out", str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "elsewhere" / "flashckpt-report.md").exists()
    assert (tmp_path / "elsewhere" / "flashckpt-attention-memory.png").exists()


def test_compare_prints_markdown(results_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(results_file), str(results_file), "--metric", "step_time_s"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# pytest-flashckpt: run A vs run B")
    assert "| scenario" in out and "+0.0%" in out and "peak_bytes" not in out


def test_compare_to_file(results_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "comment.md"
    assert main(["compare", str(results_file), str(results_file), "--out", str(out)]) == 0
    assert "peak_bytes" in out.read_text(encoding="utf-8")


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.json"
    err = _error(["report", str(missing)], capsys)
    assert str(missing) in err and "no such results file" in err


def test_invalid_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    err = _error(["compare", str(bad), str(bad)], capsys)
    assert str(bad) in err and "not a JSON results file" in err


def test_wrong_schema_version(results_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(results_file.read_text(encoding="utf-8"))
    data["schema_version"] = 999
    results_file.write_text(json.dumps(data), encoding="utf-8")
    err = _error(["report", str(results_file)], capsys)
    assert str(results_file) in err and "schema_version 999" in err


def test_not_a_results_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other.json"
    other.write_text("[1, 2]", encoding="utf-8")
    assert str(other) in _error(["report", str(other)], capsys)


def test_directory_instead_of_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert str(tmp_path) in _error(["report", str(tmp_path)], capsys)


def test_help_and_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "report" in out and "compare" in out and "schema version" in out
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2


def test_claims_lists_the_article(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["claims"]) == 0
    out = capsys.readouterr().out
    assert "prototype" in out and "gradient_checkpointing" in out and "±10 pp" in out
    assert "save: async stall <= 10% of a sync save" in out
