"""A suite scenario with ``simulate: {enabled: true}``: its step simulated on meta, recorded as ``simulated_*``
metrics (never ``peak_bytes``: a prediction is not a measurement, and the report marks it as simulated).

Strategy ``budget``: the plan is chosen from simulated costs (``simulate.costs.SimulatedCosts``), the planned step
is simulated, and the result records the plan (``budget_plan``, the notes), its predicted peak, the budget, the
smallest achievable and the no-checkpointing peaks and the planning time (``budget_*`` metrics);
``simulated_peak_bytes`` is the planned step's simulated peak, which equals the predicted one when the costs are
additive (``tests/simulate/test_simulated_costs.py``)."""

from __future__ import annotations

import time
from functools import lru_cache

from pytest_flashckpt.config.step_impl import StepImpl
from pytest_flashckpt.simulate.result import SimulatedPeak
from pytest_flashckpt.simulate.step import simulate_step


@lru_cache(maxsize=64)
def _cached(card: str, dtype: str, batch: int, seq: int, kernel: str, strategy: str, k: int, target: str, world_size: int,
            budget: str | int | float | None = None, precision: str = "pure", impl: StepImpl | None = None) -> SimulatedPeak:
    """The simulation is deterministic: a reference shared by several scenarios of a suite is simulated once."""
    return simulate_step(card, dtype, batch, seq, kernel, strategy, k=k, target=target, world_size=world_size, budget=budget,
                         precision=precision, impl=impl)


def run_simulated(scenario, result) -> None:
    """Fill ``result`` (a ``Result``) with the simulated peak of ``scenario`` and, for a strategy, its saving
    against the simulated reference (no activation checkpointing, same everything else)."""
    sim = scenario.simulate
    if scenario.activation.save_ops is not None:
        raise ValueError("simulate: a custom activation.save_ops list is not supported in suites; use the Python API")
    if _context_alone(scenario):  # a context-parallel rank alone: the meta step with torch's ring (modelled)
        return _context_scenario(scenario, result)
    if sim.world_size > 1:  # FSDP ranks: the real engine under fake mode, where it runs (else the modelled route)
        from pytest_flashckpt.simulate.layouts import engine_cannot_run_scenario, run_engine_scenario

        if engine_cannot_run_scenario(scenario) is None:
            return run_engine_scenario(scenario, result)
    common = (simulated_card(scenario), scenario.dtype, scenario.batch_size, scenario.seq_len, sim.kernel)
    tail = (sim.target, sim.world_size)
    budget = scenario.activation.budget if scenario.activation.strategy == "budget" else None
    peak = _cached(*common, scenario.activation.strategy, scenario.activation.k, *tail, budget, scenario.precision,
                   scenario.step_impl)
    result.device = "meta"
    result.probe = "simulated"
    result.backend = sim.kernel
    result.kernel = peak.kernel
    m = result.metrics
    m["simulated_peak_bytes"] = peak.peak_bytes
    m["simulated_start_bytes"] = peak.start_bytes
    for category, nbytes in peak.breakdown.items():
        m[f"simulated_{category}_bytes"] = nbytes
    m["simulate_seconds"] = peak.seconds
    m["world_size"] = peak.world_size
    if scenario.activation.strategy != "none":
        reference = _cached(*common, "none", 2, *tail, None, scenario.precision, scenario.step_impl)
        m["simulated_reference_peak_bytes"] = reference.peak_bytes
        m["simulated_memory_saving"] = 1.0 - peak.peak_bytes / reference.peak_bytes
    m["simulated_kept_bytes"] = sum(peak.block_kept_bytes) + peak.outside_kept_bytes
    m["simulated_block_kept_bytes"] = max(peak.block_kept_bytes)
    m.update(_formulas(scenario, peak))
    if peak.plan:
        _record_plan(peak.plan, result)
    result.notes.append(f"simulated on meta: peak at {peak.peak_op} in the {peak.peak_phase}")


def simulated_card(scenario):
    """The card ``scenario`` simulates: its model card's name, or its Hugging Face config's card
    (``models.hf.card``: the same builder the measured run uses, with the suite's dropout and anatomy)."""
    spec = scenario.model
    if spec.hf is None:
        return scenario.card
    from pytest_flashckpt.models.hf.card import hf_card

    return hf_card(spec.hf, spec.dropout, spec.anatomy)


def _record_plan(plan: dict, result) -> None:
    m = result.metrics
    m["budget_bytes"] = plan["budget_bytes"]
    m["budget_predicted_peak_bytes"] = plan["predicted_peak_bytes"]
    m["budget_min_peak_bytes"] = plan["min_peak_bytes"]
    m["budget_none_peak_bytes"] = plan["none_peak_bytes"]
    m["budget_recompute_flops"] = plan["recompute_flops"]
    m["budget_plan_seconds"] = plan["plan_s"]
    m["budget_costs_seconds"] = plan["measure_s"]
    m["budget_plan"] = plan["describe"]
    result.notes.append(f"activation: budget plan (simulated costs): {plan['describe']}")
    for name, why in plan["excluded"].items():
        result.notes.append(f"budget plan: option {name} left out: {why}")
    for note in plan["notes"]:
        result.notes.append(f"budget plan: {note}")


def _formulas(scenario, peak: SimulatedPeak) -> dict[str, int]:
    """The analytic model's block and peak and Korthikanti's per-layer bytes, beside the simulated ones."""
    from pytest_flashckpt.activation import analytic
    from pytest_flashckpt.models.cards import load_card
    from pytest_flashckpt.simulate.formulas import korthikanti_block_bytes

    if scenario.model.hf is not None:  # the analytic formulas are the project's families': none for a HF model ("—")
        return {}
    if scenario.activation.strategy != "none" or peak.world_size != 1 or peak.precision != "pure":
        return {}  # (the analytic model and Korthikanti's formula know one dtype for states and activations)
    if scenario.step_impl != StepImpl():  # the analytic peak is AdamW's step with the plain loss
        return {}
    config = load_card(scenario.card)
    if not analytic.supports(config):  # GPT formulas (ours, Korthikanti's) on another family's block: never; "—"
        return {}
    backend = {"sdpa": "sdpa" if peak.target == "cpu" else "flash_attn", "eager": "eager"}.get(scenario.simulate.kernel, "flash_attn")
    itemsize = 4 if peak.dtype == "float32" else 2
    work = analytic.Workload(peak.batch_size, peak.seq_len, backend, itemsize, peak.target)
    estimate = analytic.estimate(config, work, "none")
    out = {"analytic_block_kept_bytes": max(estimate.block_bytes), "analytic_peak_bytes": estimate.peak_bytes}
    if itemsize == 2:
        out["korthikanti_block_bytes"] = korthikanti_block_bytes(config, peak.batch_size, peak.seq_len)
    return out


def layout_refusal(scenario) -> str | None:
    """Why a simulated scenario's layout cannot be simulated (one line with the reason), or None: a
    context-parallel rank's request (``_context_refusal``), else what the real engine under fake mode does not run
    (``simulate.layouts.engine_cannot_run_scenario``)."""
    if _context_alone(scenario):
        return _context_refusal(scenario)
    from pytest_flashckpt.simulate.layouts import engine_cannot_run_scenario

    return engine_cannot_run_scenario(scenario)


def _context_alone(scenario) -> bool:
    """A cp layout alone in pure precision (the CUDA-op ring on meta, modelled); a cp layout composed with FSDP or
    tensor parallel, or in mixed precision, is the engine's rank (``config.layout.context_composed``)."""
    from pytest_flashckpt.config.layout import context_composed

    return scenario.layout.cp > 1 and not context_composed(scenario.parallel_layout, scenario.precision)


def _context_refusal(scenario) -> str | None:
    """Why the scenario's context-parallel rank cannot be simulated (``simulate.context_parallel.check_request``:
    the sequence split over the ring, the CUDA flash op in bf16/fp16, pure precision), or None."""
    from pytest_flashckpt.models.cards import load_card
    from pytest_flashckpt.simulate.context_parallel import check_request

    if scenario.precision != "pure":
        return f"precision {scenario.precision}: a context-parallel rank is simulated in pure precision only so far"
    try:
        check_request(load_card(scenario.card), scenario.parallel_layout, batch_size=scenario.batch_size,
                      seq_len=scenario.seq_len, kernel=scenario.simulate.kernel, dtype=scenario.dtype,
                      load_balanced=True, rotation="allgather")
    except ValueError as exc:
        return str(exc)
    return None


def _context_scenario(scenario, result) -> None:
    """A context-parallel scenario: one of ``cp`` ranks with torch's ring attention on meta
    (``simulate.context_parallel.simulate_cp_rank``, labelled modelled until a GPU has measured a cp rank), its
    breakdown by category, and its saving against the same rank without activation checkpointing."""
    from pytest_flashckpt.models.cards import load_card
    from pytest_flashckpt.simulate.context_parallel import LABEL, simulate_cp_rank
    from pytest_flashckpt.simulate.layouts import record_rank

    card, layout, started = load_card(scenario.card), scenario.parallel_layout, time.perf_counter()

    def rank(strategy: str) -> dict:
        return simulate_cp_rank(card, layout, batch_size=scenario.batch_size, seq_len=scenario.seq_len,
                                dtype=scenario.dtype, kernel=scenario.simulate.kernel, strategy=strategy,
                                k=scenario.activation.k)

    record = record_rank(scenario, result, rank, started, "start_bytes", f"ring attention ({LABEL})")
    for category, nbytes in record["breakdown"].items():
        result.metrics[f"simulated_{category}_bytes"] = nbytes
    ring = record["peak_bytes"] - record["local_attention_peak_bytes"]
    result.notes.append(f"{record['label']}: one of {layout.cp} context-parallel ranks at {record['seq_per_rank']} "
                        f"tokens with torch's ring attention on meta ({record['rotation']} rotation, load-balanced); "
                        f"the ring adds {ring:,} B over attention within the rank's own chunk; peak at "
                        f"{record['peak_op']} in the {record['peak_phase']}")
