"""The pytest-benchmark bridge degrades with a note, never an exception, when the plugin is absent, disabled or
its internals differ."""

from types import SimpleNamespace

from pytest_flashckpt.plugin.benchmark_bridge import BenchmarkBridge
from pytest_flashckpt.core.result import Result
from pytest_flashckpt.config.scenario import Scenario


def _result():
    r = Result("mini", "a", "measured", Scenario("a", suite="mini"))
    r.samples = {"step_time_s": [0.1, 0.2]}
    r.metrics = {"peak_bytes": 10}
    return r


def test_absent_or_disabled_plugin_is_a_no_op():
    BenchmarkBridge(SimpleNamespace()).add(None, _result())
    disabled = SimpleNamespace(_benchmarksession=SimpleNamespace(disabled=True, skip=False))
    bridge = BenchmarkBridge(disabled)
    bridge.add(None, _result())
    assert bridge.session is None and bridge.note is None


def test_changed_internals_leave_a_note_and_stop_forwarding():
    odd = SimpleNamespace(disabled=False, skip=False, benchmarks=[], logger=None, options={"no_such_option": 1})
    bridge = BenchmarkBridge(SimpleNamespace(_benchmarksession=odd))
    bridge.add(SimpleNamespace(name="a", nodeid="mini::a"), _result())
    assert bridge.session is None and "step timings not forwarded (TypeError" in bridge.note
    bridge.add(SimpleNamespace(name="a", nodeid="mini::a"), _result())  # later scenarios: silently skipped
