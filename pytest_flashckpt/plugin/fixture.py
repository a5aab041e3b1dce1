"""The ``flashckpt`` fixture: measure your own model's training step with the suite's probes and timing.

    def test_my_model(flashckpt):
        m = flashckpt.measure(step, resident=model, reference=plain_step, rounds=5)
        assert m.overhead < 1.5            # or declare it: @pytest.mark.flashckpt(max_overhead=1.5)

What ``measure`` runs is ``plugin.step_measure.measure`` (pytest-free). That module imports torch and the runner,
so it is imported when ``measure`` is first called: merely having the plugin installed stays free.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from pytest_flashckpt.plugin.measurement import Measurement

__all__ = ["FlashckptFixture", "Measurement", "flashckpt"]


class FlashckptFixture:
    """The object the ``flashckpt`` fixture yields; keeps every measurement for the marker's budget check."""

    def __init__(self, node: pytest.Item) -> None:
        self.node = node
        self.measurements: list[Measurement] = []

    def measure(self, step: Callable[[], object], **kwargs: Any) -> Measurement:
        """See ``pytest_flashckpt.plugin.step_measure.measure``; numeric results also become JUnit properties."""
        from pytest_flashckpt.plugin.step_measure import measure  # imports torch: only when a test measures

        result = measure(step, **kwargs)
        self.measurements.append(result)
        prefix = f"{result.name}." if result.name else ""
        for key, value in result.as_dict().items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.node.user_properties.append((f"flashckpt.{prefix}{key}", value))
        return result


@pytest.fixture
def flashckpt(request: pytest.FixtureRequest) -> FlashckptFixture:
    """Measure your own training step: ``flashckpt.measure(step, resident=model, reference=plain_step)``; budgets
    from ``@pytest.mark.flashckpt(...)`` are checked after the test body."""
    return FlashckptFixture(request.node)
