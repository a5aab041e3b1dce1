"""``Result`` (one scenario, plain data) and ``RunRecord`` (one suite run): what the runner returns, what
``results.json`` holds, what baselines and reports read. JSON-serialisable and schema-versioned."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pytest_flashckpt.core.comparison import Comparison
from pytest_flashckpt.core.files import atomic_write_text

SCHEMA_VERSION = 1

Status = Literal["measured", "skipped", "error"]
Metric = float | int | str | None


@dataclass
class Result:
    """Measurements of one scenario. ``metrics`` holds the named metrics of ``pytest_flashckpt.core.metrics`` (``peak_bytes``,
    ``memory_saving``, ``overhead``, ``save_stall_s``...); ``samples`` the per-round values behind them."""

    suite: str
    scenario: str
    status: Status
    config: dict[str, Any]
    reason: str | None = None  # why it was skipped, or the error
    device: str = "cpu"
    backend: str | None = None  # the concrete backend asked for (after resolving ``auto``)
    kernel: str | None = None  # the attention kernel detected while it ran
    probe: str | None = None
    metrics: dict[str, Metric] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.suite}::{self.scenario}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Result":
        return cls(**data)


@dataclass
class RunRecord:
    """A whole suite run: the hardware/software profile, when and from which commit, and every result."""

    profile: dict[str, Any]
    profile_id: str
    created: str
    commit: str | None
    suite: str
    device: str
    probe: str
    results: list[Result]
    tool_version: str = ""
    schema_version: int = SCHEMA_VERSION
    comparison: Comparison | None = None  # regression verdicts, when a baseline was compared
    notes: list[str] = field(default_factory=list)  # conditions of the run a reader must know (parallel xdist workers)
    interrupted: bool = False  # stopped by Ctrl-C / SIGTERM: a partial run (its finished scenarios), never a baseline

    def __post_init__(self) -> None:
        self.comparison = Comparison.coerce(self.comparison)  # its JSON form (a mapping) is accepted too

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["results"] = [r.to_dict() for r in self.results]
        return data

    def write_json(self, path: Path) -> None:
        """Write atomically (temp file + rename): a reader never sees half a results file."""
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunRecord":
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(f"results schema_version {version!r} is not supported (this version reads {SCHEMA_VERSION})")
        data = dict(data)
        data["results"] = [Result.from_dict(r) for r in data["results"]]
        return cls(**data)

    @classmethod
    def read_json(cls, path: Path) -> "RunRecord":
        """Load a results file; missing files, bad JSON and other schemas are ValueErrors naming the file."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ValueError(f"{path}: no such results file (a suite run writes flashckpt-report/results.json)") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not a JSON results file ({exc})") from None
        if not isinstance(data, dict) or "results" not in data:
            raise ValueError(f"{path}: not a pytest-flashckpt results file (no 'results' key)")
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from None
