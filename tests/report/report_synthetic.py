"""Synthetic results for report tests: round, obviously made-up numbers (a 100 MiB reference, 1.00 s steps),
built from real ``Scenario`` objects so the configs have the shape a suite run writes."""

from __future__ import annotations

from pytest_flashckpt.config.scenario import ActivationConfig, SaveConfig, Scenario
from pytest_flashckpt.config.typed import to_plain
from pytest_flashckpt.result import Result, RunRecord

MIB = 2**20
REF_PEAK = 100 * MIB
STATE = 20 * MIB


def result(scenario: Scenario, status: str = "measured", reason: str | None = None, **metrics) -> Result:
    return Result(
        suite=scenario.suite, scenario=scenario.name, status=status, config=to_plain(scenario), reason=reason,
        backend=None if status != "measured" else (scenario.attention if scenario.attention != "auto" else "sdpa"),
        kernel=None if status != "measured" else ("eager" if scenario.attention == "eager" else "sdpa-flash-cpu"),
        probe="cpu", metrics=metrics,
    )


def strategy(name: str, saving: float, overhead: float, activation: ActivationConfig, save: SaveConfig | None = None,
             article: str | None = None, **extra) -> Result:
    scenario = Scenario(name=name, suite="synthetic", attention="sdpa", activation=activation,
                        save=save or SaveConfig(), article=article)
    return result(
        scenario,
        peak_bytes=int(REF_PEAK * (1 - saving)), reference_peak_bytes=REF_PEAK, state_bytes=STATE, memory_saving=saving,
        step_time_s=overhead, reference_step_time_s=1.0, overhead=overhead, overhead_min=overhead - 0.05,
        overhead_max=overhead + 0.05, **extra,
    )


def save_metrics(stall: float, total: float) -> dict:
    return dict(save_stall_s=stall, save_total_s=total, bytes_written=50 * MIB, write_MBps=500.0, load_s=0.1,
                save_extra_peak_bytes=10 * MIB, files=3, raw_write_MBps=1000.0, copy_GBps=10.0,
                reference_save_total_s=1.0, stall_vs_sync=stall / 1.0, write_vs_raw=0.5, format="torch")


def attention(backend: str, seq_len: int, peak_mib: int | None, reason: str | None = None) -> Result:
    scenario = Scenario(name=f"{backend}-s{seq_len}", suite="synthetic", attention=backend, seq_len=seq_len)
    if peak_mib is None:
        return result(scenario, status="skipped", reason=reason)
    return result(scenario, peak_bytes=peak_mib * MIB, state_bytes=STATE, step_time_s=1.0)


def results() -> list[Result]:
    """Every section has data: the three table claims, the single claim, a skip, attention pairs, saves."""
    return [
        strategy("prototype", 0.30, 1.05, ActivationConfig("every_k", k=2), SaveConfig(strategy="async"),
                 article="prototype", flop_ratio=1.15, **save_metrics(0.05, 1.0)),
        strategy("medium", 0.55, 1.30, ActivationConfig("full"), SaveConfig(strategy="selective"),
                 article="medium", flop_ratio=1.33, **save_metrics(0.80, 0.80)),
        strategy("large", 0.55, 1.30, ActivationConfig("full"), SaveConfig(strategy="layerwise"),
                 article="large", flop_ratio=1.33, **save_metrics(0.90, 0.90)),
        strategy("gc", 0.40, 1.18, ActivationConfig("full"), article="gradient_checkpointing", flop_ratio=1.33,
                 analytic_peak_bytes=50 * MIB),
        result(Scenario(name="offload", suite="synthetic", activation=ActivationConfig("offload")), status="skipped",
               reason="SYNTHETIC-SKIP offload needs a CUDA device"),
        attention("eager", 512, 80), attention("sdpa", 512, 60),
        attention("eager", 2048, 400), attention("sdpa", 2048, 100),
        attention("flash_attn", 2048, None, reason="SYNTHETIC-SKIP flash-attn is not installed"),
    ]


def comparison() -> dict:
    return {
        "status": "compared", "baseline_path": "baselines/synthetic.json", "baseline_profile_id": "synthetic-profile",
        "message": None,
        "verdicts": [
            {"scenario": "synthetic::medium", "metric": "peak_bytes", "baseline": 40 * MIB, "current": 45 * MIB,
             "change": 0.125, "p_value": None, "verdict": "regressed"},
            {"scenario": "synthetic::medium", "metric": "overhead", "baseline": 1.3, "current": 1.31, "change": 0.0077,
             "p_value": 0.5, "verdict": "ok"},
        ],
    }


def record(results_: list[Result] | None = None, comparison_: dict | None = None) -> RunRecord:
    return RunRecord(
        profile={"device_type": "cpu", "device_name": "Synthetic CPU", "device_count": 1, "cpu_threads": 2,
                 "torch": "0.0.0", "cuda": None, "flash_attn": None, "kernel": "sdpa", "machine": "x86_64"},
        profile_id="cpu-2t-synthetic", created="2000-01-01T00:00:00+00:00", commit="abc123", suite="synthetic",
        device="cpu", probe="cpu", results=results() if results_ is None else results_, tool_version="0.0.0",
        comparison=comparison_,
    )
