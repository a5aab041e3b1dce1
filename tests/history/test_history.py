"""``flashckpt history``: runs ordered by their recorded time, change points from Apache Otava (skipped without it),
markdown and plots, clear errors for a bad folder or file."""

import random

import pytest

from pytest_flashckpt.cli import main
from pytest_flashckpt.history.series import build_series, read_runs
from pytest_flashckpt.core.result import Result, RunRecord
from pytest_flashckpt.config.scenario import Scenario

otava = pytest.importorskip("otava.analysis", reason="Apache Otava is optional: pip install --no-deps apache-otava==0.8.0 scipy")


def _write(folder, i, overhead, created=None):
    r = Result("s", "a", "measured", Scenario("a", suite="s"), probe="cpu")
    r.metrics = {"overhead": overhead, "peak_bytes": 100}
    record = RunRecord({}, "p", created or f"2026-01-01T00:{i:02d}:00", f"c{i:03d}", "s", "cpu", "cpu", [r])
    path = folder / f"artifact-{(97 * i) % 101:03d}" / "results.json"  # names in no particular order
    path.parent.mkdir(parents=True)
    record.write_json(path)


def _history(tmp_path, shift=0.0, n=30, at=15, seed=1):
    rng = random.Random(seed)
    for i in range(n):
        _write(tmp_path, i, rng.gauss(1.10, 0.02) * (1 + shift if i >= at else 1))
    return tmp_path


def test_runs_are_ordered_by_their_recorded_time(tmp_path):
    _history(tmp_path, n=8)
    history = read_runs(tmp_path)
    assert [r.commit for r, _ in history.runs] == [f"c{i:03d}" for i in range(8)]
    (s_overhead,) = [s for s in build_series(history, ("overhead",))]
    assert len(s_overhead.values) == 8 and s_overhead.scenario == "s::a"


@pytest.mark.slow
def test_a_shift_is_found_where_it_happened_with_a_plot(tmp_path, capsys):
    folder = _history(tmp_path / "runs", shift=0.08)
    assert main(["history", str(folder), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "history.md").read_text()
    assert "| s::a | overhead | 16 (2026-01-01T00:15:00) | c015 |" in text
    assert (tmp_path / "out" / "history-overhead.png").stat().st_size > 1000
    assert "peak_bytes" not in text.split("| --- |")[-1]  # a constant series has no change point


def test_no_shift_no_change_point(tmp_path):
    folder = _history(tmp_path / "runs")
    assert main(["history", str(folder), "--no-plots", "--out", str(tmp_path / "out")]) == 0
    assert "_No change point in any series._" in (tmp_path / "out" / "history.md").read_text()


def test_bad_folders_and_files_are_named(tmp_path, capsys):
    assert main(["history", str(tmp_path / "nope")]) == 2
    assert "nope: not a folder" in capsys.readouterr().err
    _write(tmp_path, 1, 1.0)
    assert main(["history", str(tmp_path)]) == 2
    assert "1 results.json read; a history needs at least two runs" in capsys.readouterr().err
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.json").write_text("{")
    assert main(["history", str(tmp_path)]) == 2  # a broken file is skipped, and one run is left
    assert "broken/results.json: not valid JSON" in capsys.readouterr().err


def test_without_otava_the_error_gives_the_install_line(monkeypatch, tmp_path, capsys):
    import builtins

    real = builtins.__import__

    def no_otava(name, *args, **kwargs):
        if name.startswith("otava"):
            raise ImportError("No module named 'otava'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_otava)
    assert main(["history", str(tmp_path)]) == 2
    assert "pip install --no-deps apache-otava==0.8.0 scipy" in capsys.readouterr().err
