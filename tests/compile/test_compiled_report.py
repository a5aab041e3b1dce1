"""The compiled section's simulated column (``compiled_simulated_peak_bytes`` beside the measured peak, or why a row
is not simulated) and a report that includes another run's compiled rows (``--flashckpt-include``, how the sample
shows the compiled suite's run). Nothing is compiled here: results are made by hand or by the fake runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_runner import FakeRunner

from pytest_flashckpt.config.run_options import OptionError, Options
from pytest_flashckpt.config.scenario import Scenario
from pytest_flashckpt.config.typed import build
from pytest_flashckpt.core.result import Result, RunRecord
from pytest_flashckpt.report.compiled import NOT_SIMULATED, compiled_section
from pytest_flashckpt.runner.suite import SuiteRun, load_checked_suite
from pytest_flashckpt.simulate.compiled import unsupported_reason


def scenario(**raw) -> Scenario:
    return build(Scenario, {"name": "s", **raw}, "suite.yaml")


def _compiled(name: str, simulated: int | None = None, note: str | None = None, **raw) -> Result:
    r = Result("compiled", name, "measured", scenario(compile={"scope": "block"}, **raw))
    r.record("peak_bytes", 100 * 2**20)
    if simulated is not None:
        r.record("compiled_simulated_peak_bytes", simulated)
    if note is not None:
        r.notes.append(note)
    return r


def _row(text: str, name: str) -> list[str]:
    line = next(line for line in text.splitlines() if f"`compiled::{name}`" in line)
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_the_simulated_peak_sits_beside_the_measured_one_with_the_gap_and_the_bound():
    near = _compiled("near", simulated=100 * 2**20 - 16, activation={"strategy": "full"})
    far = _compiled("far", simulated=110 * 2**20, activation={"strategy": "full"})
    hf = _compiled("hf", note=NOT_SIMULATED + "a Hugging Face model is not simulated compiled", activation={"strategy": "full"})
    text = "\n".join(compiled_section([near, far, hf]))
    assert _row(text, "near")[5:7] == ["100.0 MiB", "-16 B (-0.00%, within 5%)"]
    assert _row(text, "far")[6] == "+10,485,760 B (+10.00%, **outside** 5%)"  # control: a gap past the bound says so
    assert _row(text, "hf")[5:7] == ["not simulated [1]", "—"]
    assert "[1] a Hugging Face model is not simulated compiled" in text
    plain = _compiled("plain", activation={"strategy": "full"})  # control: no simulation and no reason: a dash
    assert _row("\n".join(compiled_section([plain])), "plain")[5:7] == ["—", "—"]


def test_unsupported_reason_names_what_the_simulator_does_not_build():
    assert unsupported_reason(scenario(compile={"scope": "block"}, activation={"strategy": "selective_op"})) is None
    assert unsupported_reason(scenario(compile={"scope": "block"}, activation={"strategy": "compile_budget", "budget": 0.5})) is None
    hf = scenario(compile={"scope": "block"}, model={"hf": {"model_type": "llama", "num_hidden_layers": 2}})
    assert unsupported_reason(hf) is None  # built from its config's card (models.hf.card), as the measured row is
    assert "cuda" in unsupported_reason(scenario(compile={"scope": "block"}), "cuda")
    assert "eager" in unsupported_reason(scenario(compile={"scope": "block"}, attention="eager"))
    outside = scenario(compile={"scope": "block", "ac_wrapper": "outside"}, activation={"strategy": "full"})
    assert unsupported_reason(outside) is None  # the checkpoint around the compiled block, built as the measured step
    assert "save_ops" in unsupported_reason(scenario(compile={"scope": "block"}, activation={"strategy": "selective_op", "save_ops": ["mm"]}))


EAGER_SUITE = """\
name: host
defaults: {model: tiny, batch_size: 1, seq_len: 32, rounds: 2, attention: eager, measure: [memory, timing]}
scenarios:
  - name: reference
"""


def _compiled_run(folder: Path, results: list[Result]) -> Path:
    folder.mkdir()
    record = RunRecord(profile={"device_name": "cpu"}, profile_id="cpu-test", created="2026-12-02T12:00:00+00:00",
                       commit="abc123", suite="compiled", device="cpu", probe="cpu", results=results,
                       wall_time_s=200.0, cpu_time_s=290.0)
    record.write_json(folder / "results.json")
    return folder / "results.json"


def _run(tmp_path: Path, include: tuple[str, ...]) -> str:
    (tmp_path / "host.yaml").write_text(EAGER_SUITE, encoding="utf-8")
    suite = load_checked_suite(str(tmp_path / "host.yaml"))
    options = Options(suite="host.yaml", device="cpu", report="reports/sample", include=include, no_compare=True)
    outputs = SuiteRun(suite, options, tmp_path, runner=FakeRunner()).run_all()
    return outputs.report_path.read_text()


def test_a_report_includes_another_runs_compiled_rows_with_where_they_came_from(tmp_path: Path):
    (tmp_path / "reports").mkdir()
    _compiled_run(tmp_path / "reports" / "compiled", [_compiled("compiled-gpt-full", simulated=100 * 2**20,
                                                               activation={"strategy": "full"})])
    text = _run(tmp_path, ("reports/compiled/results.json",))
    assert "`compiled::compiled-gpt-full`" in text and "## Compiled steps" in text
    assert "suite `compiled` ([../compiled/flashckpt-report.md](../compiled/flashckpt-report.md))" in text
    assert "commit `abc123`, wall time 3 min 20 s, CPU time 4 min 50 s" in text
    stored = json.loads((tmp_path / "reports" / "sample" / "results.json").read_text())
    assert stored["included"] == ["../compiled/results.json"]  # relative to the results file: re-renders find it
    assert [r["scenario"] for r in stored["results"]] == ["reference"]  # included rows are shown, never this run's
    (tmp_path / "alone").mkdir()
    assert "## Compiled steps" not in _run(tmp_path / "alone", ())  # control: without the include, no section


def test_an_include_that_is_missing_or_holds_no_compiled_row_is_refused_naming_the_file(tmp_path: Path):
    def options(raw: str) -> Options:
        return Options.from_lookup("host", lambda spec: (raw if spec.name == "flashckpt-include" else None, spec.flag))

    with pytest.raises(OptionError, match=r"--flashckpt-include: .*nothere.json: no such results file"):
        options(str(tmp_path / "nothere.json"))
    eager = _compiled_run(tmp_path / "eager", [Result("host", "reference", "measured", scenario())])
    with pytest.raises(OptionError, match=r"eager/results.json \(suite compiled\) holds no compiled scenario"):
        options(str(eager))
    good = _compiled_run(tmp_path / "good", [_compiled("c", activation={"strategy": "full"})])
    assert options(f"{good}, ").include == (str(good),)  # control: a compiled run's file is taken
