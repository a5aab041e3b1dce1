"""A scenario that cannot be measured still comes back as a ``Result``, so a run's record is whole: ``recorded``
runs a runner's body and turns what stopped it into the result's status (``skipped`` with the reason when this
hardware or installation cannot run it, ``error`` with the exception and its traceback when it broke)."""

from __future__ import annotations

import traceback
from typing import Callable

from pytest_flashckpt.core.result import Result
from pytest_flashckpt.models.attention import BackendUnavailable
from pytest_flashckpt.runner.context import SkipScenario


def recorded(result: Result, body: Callable[[], None], hint: Callable[[], str] = lambda: "") -> Result:
    """Run ``body`` (it fills ``result``); ``hint()`` is appended to an error's reason (e.g. a full disk)."""
    try:
        body()
    except (SkipScenario, BackendUnavailable) as exc:
        result.status, result.reason = "skipped", str(exc)
    except Exception as exc:  # recorded (the report shows the row), then the plugin fails the item with it
        result.status, result.reason = "error", f"{type(exc).__name__}: {exc}{hint()}"
        result.notes.append("".join(traceback.format_exception(exc)))
    return result
