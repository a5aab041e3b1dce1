"""Which results feed which part of the report. Sections and plots read the same selections, so a table and
its plot always show the same scenarios.

Everything here reads ``Result.config``, the typed scenario (parsed once from ``results.json``,
``config.record_file``): a report renders from a results file alone, on a machine without the suite files.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_flashckpt.core.result import Result

FLASH_BACKENDS = ("sdpa", "flash_attn")


def activation_strategy(r: Result) -> str:
    return r.config.activation.strategy


def save_strategy(r: Result) -> str:
    return str(r.config.save.strategy)


def card(r: Result) -> str:
    return r.config.card


def precision(r: Result) -> str:
    """``fp32``, ``bf16`` (pure) or ``mixed bf16/fp32`` (compute / master state), from the row's config."""
    return r.config.precision_label


def describe_activation(r: Result) -> str:
    """``every_k (k=2)``, ``full``, ``selective_op``... as a reader wants to see it; a compiled row says how
    (``full, compiled per block``, ``full, compiled per block, checkpoint outside``, ``compile_budget 0.5, compiled
    model``), so tables and the Pareto plot keep it apart from its eager twin and from the other placement."""
    strategy = activation_strategy(r)
    if strategy == "every_k":
        strategy = f"every_k (k={r.config.activation.k})"
    elif strategy == "compile_budget":
        strategy = f"compile_budget {r.config.activation.budget:g}"
    scope = getattr(r.config, "compile", None)
    if scope is not None and scope.enabled:  # report.compiled
        strategy += ", compiled per block" if scope.scope == "block" else ", compiled model"
        if scope.ac_wrapper == "outside":
            strategy += ", checkpoint outside"
    return strategy


def describe_save(r: Result) -> str:
    strategy = save_strategy(r)
    if strategy == "none":
        return "none"
    fmt = r.metrics.get("format") or r.config.save.format
    return f"{strategy} ({fmt})" if fmt else strategy


def describe_strategies(r: Result) -> str:
    """Both sides of a scenario: ``recompute full; save selective (torch)``."""
    save = describe_save(r)
    return f"recompute {describe_activation(r)}; " + ("no save" if save == "none" else f"save {save}")


def measured(r: Result) -> bool:
    return r.status == "measured"


def simulated(r: Result) -> bool:
    """A scenario predicted on the meta device (``simulate: {enabled: true}``), not measured: its metrics are
    ``simulated_*`` and only the simulation section shows them."""
    return r.config.simulate.enabled


def by_article(results: list[Result]) -> dict[str, list[Result]]:
    """Results grouped by the article claim their scenario tests (config ``article``)."""
    out: dict[str, list[Result]] = {}
    for r in results:
        tag = r.config.article
        if tag:
            out.setdefault(str(tag), []).append(r)
    return out


def activation_results(results: list[Result]) -> list[Result]:
    """Scenarios with an activation strategy (measured or not): the activation section and the Pareto plot."""
    return [r for r in results if activation_strategy(r) != "none" and not simulated(r)]


def checkpoint_results(results: list[Result]) -> list[Result]:
    """Scenarios with a save strategy: the checkpoint I/O section and the stall plot."""
    return [r for r in results if save_strategy(r) != "none"]


@dataclass
class AttentionPoint:
    """One (model, batch, dtype, sequence length) with its reference-configuration result per backend."""

    card: str
    batch_size: int
    dtype: str
    seq_len: int
    by_backend: dict[str, Result] = field(default_factory=dict)

    def peak(self, backend: str) -> int | None:
        r = self.by_backend.get(backend)
        value = r.metrics.get("peak_bytes") if r is not None and measured(r) else None
        return value if isinstance(value, int) else None

    def activations(self, backend: str) -> int | None:
        """Peak minus the memory alive before the step (parameters, gradients, optimizer state)."""
        r = self.by_backend.get(backend)
        peak = self.peak(backend)
        state = r.metrics.get("state_bytes") if r is not None else None
        return peak - state if peak is not None and isinstance(state, int) else None


def attention_points(results: list[Result]) -> list[AttentionPoint]:
    """Reference-configuration scenarios (no activation strategy, no save) grouped so backends line up.

    The attention backend is the one that ran (``Result.backend``, after ``auto`` was resolved); a skipped scenario
    has no resolved backend, so its asked-for ``attention`` is used. When two scenarios share a slot (the suite's
    ``reference`` with ``auto`` and the explicit ``sdpa-s512``), the one that asked for that backend by name wins.
    """
    points: dict[tuple[str, int, str, int], AttentionPoint] = {}
    for r in results:
        if activation_strategy(r) != "none" or save_strategy(r) != "none":
            continue
        if measured(r) and "peak_bytes" not in r.metrics:
            continue
        backend = r.backend or r.config.attention
        key = (card(r), r.config.batch_size, r.config.dtype, r.config.seq_len)
        point = points.setdefault(key, AttentionPoint(*key))
        current = point.by_backend.get(backend)
        if current is None or (r.config.attention == backend and current.config.attention != backend):
            point.by_backend[backend] = r
    return [points[k] for k in sorted(points)]


def attention_backends(points: list[AttentionPoint]) -> list[str]:
    """Backends present, eager first (the O(N^2) reference), then the flash kernels."""
    seen = {b for p in points for b in p.by_backend}
    order = ["eager", *FLASH_BACKENDS]
    return [b for b in order if b in seen] + sorted(seen - set(order))
