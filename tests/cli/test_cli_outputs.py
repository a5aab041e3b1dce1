"""Output folders of the commands: an ``--out`` that names an existing file (or has a file where a parent folder
would go) is one line and exit 2 before anything is written, never a traceback half-way through a write."""

from __future__ import annotations

import pytest

from pytest_flashckpt.cli import main
from pytest_flashckpt.core.files import NotAFolder, check_output_folder


def test_report_out_naming_a_file_is_one_line(results_file, tmp_path, capsys):
    (tmp_path / "taken").write_text("keep me")
    with pytest.raises(FileExistsError):  # control: what the old command hit, uncaught
        (tmp_path / "taken").mkdir(parents=True, exist_ok=True)
    assert main(["report", str(results_file), "--out", str(tmp_path / "taken")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out" in err and "taken is a file" in err
    assert (tmp_path / "taken").read_text() == "keep me"


def test_a_file_where_a_parent_folder_would_go_is_named(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotAFolder, match=r"--out .*f/sub: .*f is a file"):
        check_output_folder(tmp_path / "f" / "sub", "--out")
    assert check_output_folder(tmp_path / "new" / "sub", "--out") == tmp_path / "new" / "sub"


def test_report_out_as_a_new_folder_still_works(results_file, tmp_path, capsys):
    assert main(["report", str(results_file), "--out", str(tmp_path / "new")]) == 0
    assert (tmp_path / "new" / "flashckpt-report.md").is_file()
