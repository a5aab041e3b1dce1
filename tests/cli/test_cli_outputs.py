"""Output folders of the commands: an ``--out`` that names an existing file (or has a file where a parent folder
would go) is one line and exit 2 before anything is written, never a traceback half-way through a write."""

from __future__ import annotations

import pytest

from pytest_flashckpt.cli import main
from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.preflight import check_output_folder


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
    with pytest.raises(ConfigError, match=r"--out: .*f is a file, so .*f/sub cannot be made"):
        check_output_folder("--out", tmp_path / "f" / "sub")
    check_output_folder("--out", tmp_path / "new" / "sub")  # a folder that can be made passes


def test_report_out_as_a_new_folder_still_works(results_file, tmp_path, capsys):
    assert main(["report", str(results_file), "--out", str(tmp_path / "new")]) == 0
    assert (tmp_path / "new" / "flashckpt-report.md").is_file()


def test_compare_out_naming_a_folder_is_one_line(results_file, tmp_path, capsys):
    folder = tmp_path / "a-folder"
    folder.mkdir()
    with pytest.raises(IsADirectoryError):  # control: what the old command's write_text hit, uncaught
        folder.write_text("x")
    assert main(["compare", str(results_file), str(results_file), "--out", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a folder" in err and "--out" in err
    assert main(["compare", str(results_file), str(results_file), "--out", str(tmp_path / "c.md")]) == 0
    assert (tmp_path / "c.md").read_text(encoding="utf-8").startswith("#") or (tmp_path / "c.md").stat().st_size > 0


@pytest.mark.parametrize("command", ["report", "compare", "pool-baseline"])
def test_a_fifo_named_as_results_is_refused_unopened(command, tmp_path, capsys):
    import os
    import threading

    fifo = tmp_path / "results.json"
    os.mkfifo(fifo)
    # control: opening it for reading blocks until a writer comes (here a thread that gives up after 0.2 s)
    opened = threading.Event()
    reader = threading.Thread(target=lambda: (open(fifo, "rb").close(), opened.set()), daemon=True)
    reader.start()
    reader.join(0.2)
    assert not opened.is_set()
    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # release the blocked reader
    reader.join(5)
    args = [str(fifo)] * (2 if command == "compare" else 1)
    if command == "pool-baseline":
        args += ["--out", str(tmp_path / "baselines")]
    assert main([command, *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a regular file" in err
