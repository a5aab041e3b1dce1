"""Synthetic results for report tests: round, obviously made-up numbers (a 100 MiB reference, 1.00 s steps),
built from real ``Scenario`` objects so the configs have the shape a suite run writes."""

from __future__ import annotations

from pytest_flashckpt.config.scenario import ActivationConfig, SaveConfig, Scenario
from pytest_flashckpt.core.comparison import Comparison
from pytest_flashckpt.core.result import Result, RunRecord

MIB = 2**20
REF_PEAK = 100 * MIB
STATE = 20 * MIB


def result(scenario: Scenario, status: str = "measured", reason: str | None = None, **metrics) -> Result:
    return Result(
        suite=scenario.suite, scenario=scenario.name, status=status, config=scenario, reason=reason,
        backend=None if status != "measured" else (scenario.attention if scenario.attention != "auto" else "sdpa"),
        kernel=None if status != "measured" else ("eager" if scenario.attention == "eager" else "sdpa-flash-cpu"),
        probe="cpu", metrics=metrics,
    )


def strategy(name: str, saving: float, overhead: float, activation: ActivationConfig, save: SaveConfig | None = None,
             article: str | None = None, spread: float = 0.05, seq_len: int = 512, **extra) -> Result:
    measure = ("memory", "timing", "checkpoint") if save is not None else ("memory", "timing")
    scenario = Scenario(name=name, suite="synthetic", attention="sdpa", activation=activation, seq_len=seq_len,
                        save=save or SaveConfig(), article=article, measure=measure)
    return result(
        scenario,
        peak_bytes=int(REF_PEAK * (1 - saving)), reference_peak_bytes=REF_PEAK, state_bytes=STATE, memory_saving=saving,
        step_time_s=overhead, reference_step_time_s=1.0, overhead=overhead, overhead_min=overhead - spread,
        overhead_max=overhead + spread, **extra,
    )


def save_metrics(stall: float, total: float, bytes_share: float = 1.0, deferrals: int = 0, forced: int = 0) -> dict:
    return dict(save_stall_s=stall, save_total_s=total, bytes_written=int(50 * MIB * bytes_share), write_MBps=500.0,
                load_s=0.1, save_extra_peak_bytes=10 * MIB, files=3, raw_write_MBps=1000.0, copy_GBps=10.0,
                reference_save_total_s=1.0, stall_vs_sync=stall / 1.0, write_vs_raw=0.5, format="torch",
                reference_bytes_written=50 * MIB, bytes_vs_full=bytes_share, deferrals=deferrals, forced_saves=forced)


def article_rows() -> list[Result]:
    """The article's three rows, each over three workloads (seq 256, 512, 1024): prototype holds on all three,
    medium on two (its 1024 workload saves too much), large on none (the schedule never deferred)."""
    out = []
    for seq, medium_saving in ((256, 0.45), (512, 0.55), (1024, 0.65)):
        out += [
            strategy(f"prototype-s{seq}", 0.30, 1.05, ActivationConfig("selective_op"), SaveConfig(strategy="async"),
                     article="prototype", spread=0.02, seq_len=seq, **save_metrics(0.05, 1.0)),
            strategy(f"medium-s{seq}", medium_saving, 1.30, ActivationConfig("full"), SaveConfig(strategy="selective"),
                     article="medium", spread=0.02, seq_len=seq, **save_metrics(0.80, 0.80, bytes_share=0.6)),
            strategy(f"large-s{seq}", 0.55, 1.30, ActivationConfig("full"),
                     SaveConfig(strategy="scheduled", mem_threshold=0.6, layer_checkpoint_dir="layers"),
                     article="large", spread=0.02, seq_len=seq, **save_metrics(0.90, 0.90, deferrals=0)),
        ]
    return out


def attention(backend: str, seq_len: int, peak_mib: int | None, reason: str | None = None) -> Result:
    scenario = Scenario(name=f"{backend}-s{seq_len}", suite="synthetic", attention=backend, seq_len=seq_len)
    if peak_mib is None:
        return result(scenario, status="skipped", reason=reason)
    return result(scenario, peak_bytes=peak_mib * MIB, state_bytes=STATE, step_time_s=1.0)


def results() -> list[Result]:
    """Every section has data: the three table claims, the single claim, a skip, attention pairs, saves."""
    return [
        *article_rows(),
        strategy("gc", 0.40, 1.18, ActivationConfig("full"), article="gradient_checkpointing", flop_ratio=1.33,
                 analytic_peak_bytes=50 * MIB),
        result(Scenario(name="offload", suite="synthetic", activation=ActivationConfig("offload")), status="skipped",
               reason="SYNTHETIC-SKIP offload needs a CUDA device"),
        attention("eager", 512, 80), attention("sdpa", 512, 60),
        attention("eager", 2048, 400), attention("sdpa", 2048, 100),
        attention("flash_attn", 2048, None, reason="SYNTHETIC-SKIP flash-attn is not installed"),
    ]


def comparison() -> Comparison:
    return Comparison.from_dict({
        "status": "compared", "baseline_path": "baselines/synthetic.json", "baseline_profile_id": "synthetic-profile",
        "message": None,
        "verdicts": [
            {"scenario": "synthetic::medium-s512", "metric": "peak_bytes", "baseline": 40 * MIB, "current": 45 * MIB,
             "change": 0.125, "p_value": None, "verdict": "regressed"},
            {"scenario": "synthetic::medium-s512", "metric": "overhead", "baseline": 1.3, "current": 1.31, "change": 0.0077,
             "p_value": 0.5, "verdict": "ok"},
        ],
    })


def record(results_: list[Result] | None = None, comparison_: Comparison | None = None) -> RunRecord:
    return RunRecord(
        profile={"device_type": "cpu", "device_name": "Synthetic CPU", "device_count": 1, "cpu_threads": 2,
                 "torch": "0.0.0", "cuda": None, "flash_attn": None, "kernel": "sdpa", "machine": "x86_64"},
        profile_id="cpu-2t-synthetic", created="2000-01-01T00:00:00+00:00", commit="abc123", suite="synthetic",
        device="cpu", probe="cpu", results=results() if results_ is None else results_, tool_version="0.0.0",
        comparison=comparison_,
    )
