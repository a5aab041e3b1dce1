"""Every report row that lists a scenario names its precision: the dtype (pure) or ``mixed bf16/fp32``; a result
written before the field existed (no ``precision`` in its config) reads as pure."""

from report_synthetic import result

from pytest_flashckpt.config.record_file import result_from_dict
from pytest_flashckpt.config.scenario import ActivationConfig, Scenario, SimulateConfig
from pytest_flashckpt.report.activation import activation_section
from pytest_flashckpt.report.scenarios import scenarios_section
from pytest_flashckpt.report.select import precision
from pytest_flashckpt.report.simulation import simulation_section


def _pair():
    pure = result(Scenario(name="act-full", dtype="bfloat16", activation=ActivationConfig(strategy="full")), peak_bytes=100)
    mixed = result(Scenario(name="act-full-mixed", dtype="bfloat16", precision="mixed",
                            activation=ActivationConfig(strategy="full")), peak_bytes=200)
    return pure, mixed


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _lines(section: list[str]) -> list[str]:
    return "\n".join(section).splitlines()


def _row(section: list[str], name: str) -> list[str]:
    return next(cells for cells in map(_cells, _lines(section)) if cells[0].strip("`").endswith(name))


def _header(section: list[str]) -> list[str]:
    return _cells(next(line for line in _lines(section) if line.startswith("| scenario")))


def test_scenario_and_activation_tables_name_the_precision():
    pure, mixed = _pair()
    for section in (scenarios_section, activation_section):
        lines = section([pure, mixed])
        column = _header(lines).index("precision")
        assert _row(lines, "act-full")[column] == "bf16" and _row(lines, "act-full-mixed")[column] == "mixed bf16/fp32"


def test_simulation_table_names_the_precision():
    sim = SimulateConfig(enabled=True, kernel="sdpa", target="cpu")
    r = result(Scenario(name="tiny-mixed", dtype="bfloat16", precision="mixed", simulate=sim), simulated_peak_bytes=1000,
               simulated_parameters_bytes=400)
    r.probe = "simulated"
    lines = simulation_section([r])
    assert _row(lines, "tiny-mixed")[_header(lines).index("precision")] == "mixed bf16/fp32"


def test_a_result_without_the_field_reads_as_pure():
    """A results file written before ``precision`` existed has no such key: parsed with the typed default (pure)."""
    pure, _ = _pair()
    stored = pure.to_dict()
    del stored["config"]["precision"]
    assert precision(result_from_dict(stored)) == "bf16"
    stored["config"]["precision"] = "mixed"  # control: the key is read when present
    assert precision(result_from_dict(stored)) == "mixed bf16/fp32"
