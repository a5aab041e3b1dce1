"""Per-rank records -> one Result (slowest rank, max/per-rank peaks, summed bytes), its report section, and the
``world_size`` key of a scenario. No ranks are started here."""

from __future__ import annotations

import pytest

from pytest_flashckpt.config.scenario import Scenario, SaveConfig
from pytest_flashckpt.config.suites import load_suite
from pytest_flashckpt.distributed.aggregate import aggregate
from pytest_flashckpt.report.distributed import distributed_section
from pytest_flashckpt.core.result import Result


def _rank(rank: int, peak: int, times: list[float], stalls: list[float], nbytes: int, roundtrip: int = 0) -> dict:
    record = {
        "rank": rank, "world_size": 2, "status": "measured", "backend": "sdpa", "kernel": "math", "activation": "full on blocks 0-3",
        "peak_bytes": peak, "fwd_bwd_peak_bytes": peak - 10, "optimizer_peak_bytes": peak, "state_bytes": 100,
        "step_time_s": times, "load_s": 0.5 + rank,
        "saves": [{"save_stall_s": s, "save_total_s": s + 1, "bytes_written": nbytes, "async_rss_added_bytes": 7,
                   "async_staged_bytes": 50} for s in stalls],
    }  # fmt: skip
    if rank == 0:
        record.update(roundtrip_differences=roundtrip, roundtrip_tensors=117)
    return record


def _result(world_size: int = 2) -> Result:
    scenario = Scenario("s", world_size=world_size, batch_size=4, save=SaveConfig(strategy="dcp", async_save=True))

    return Result("distributed", "s", "measured", scenario)


def test_the_slowest_rank_sets_step_and_save_times_and_the_largest_rank_the_peak() -> None:
    result = _result()
    aggregate(result, [_rank(1, 300, [1.0, 4.0, 2.0], [0.5, 0.1], 1000), _rank(0, 200, [3.0, 1.0, 1.0], [0.2, 0.3], 1500)])
    m, s, ranks = result.metrics, result.samples, result.per_rank
    assert result.status == "measured"
    assert s["step_time_s"] == [3.0, 4.0, 2.0] and m["step_time_s"] == 3.0
    assert s["save_stall_s"] == [0.5, 0.3] and m["save_stall_s"] == 0.4 and m["save_total_s"] == 1.4
    assert ranks["peak_bytes"] == [200, 300] and m["peak_bytes"] == 300 and m["fwd_bwd_peak_bytes"] == 290
    assert ranks["bytes_written"] == [1500, 1000] and m["bytes_written"] == 2500
    assert ranks["step_time_s"] == [1.0, 2.0] and set(s) == {"step_time_s", "save_stall_s", "save_total_s"}
    assert m["async_staged_bytes"] == 100 and m["async_rss_added_bytes"] == 14 and m["load_s"] == 1.5
    assert m["roundtrip_differences"] == 0 and m["world_size"] == 2


def test_a_rank_record_under_a_name_outside_the_vocabulary_is_refused_where_it_is_written() -> None:
    from pytest_flashckpt.core.metrics import UnknownMetric
    from pytest_flashckpt.distributed.rank import _save_record

    class Save:  # a sharded save as distributed.sharded_store records it
        stall_s, total_s, bytes_written, staged_bytes, host_bytes_added = 0.1, 0.2, 10, 5, 1

    assert set(_save_record(Save())) == {"save_stall_s", "save_total_s", "bytes_written", "async_staged_bytes",
                                         "async_rss_added_bytes"}
    with pytest.raises(UnknownMetric, match="'stall_s' is not a metric of the vocabulary"):
        Result("d", "s", "measured", Scenario("s", suite="d")).record("stall_s", 0.1)


def test_a_round_trip_that_differs_or_a_failed_rank_is_an_error() -> None:
    result = _result()
    aggregate(result, [_rank(0, 1, [1.0], [0.1], 1, roundtrip=3), _rank(1, 1, [1.0], [0.1], 1)])
    assert result.status == "error" and "3 of 117 tensors" in result.reason
    result = _result()
    aggregate(result, [_rank(0, 1, [1.0], [0.1], 1), {"rank": 1, "status": "error", "reason": "ValueError: boom", "traceback": "tb"}])
    assert result.status == "error" and result.reason == "rank 1: ValueError: boom" and "tb" in result.notes


def test_the_report_section_lists_per_rank_numbers_and_says_when_there_is_nothing() -> None:
    result = _result()
    aggregate(result, [_rank(0, 2**20, [1.0], [0.1], 2**20), _rank(1, 2 * 2**20, [1.0], [0.1], 2**20)])
    text = "\n".join(distributed_section([result]))
    assert "`distributed::s`" in text and "1.0 MiB / 2.0 MiB" in text and "dcp.async_save" in text and "bitwise" in text
    assert "No distributed scenario" in "\n".join(distributed_section([]))


def test_world_size_is_validated_before_anything_runs() -> None:
    with pytest.raises(ValueError, match="world_size must be a positive"):
        Scenario("s", world_size=0)
    with pytest.raises(ValueError, match="checkpoint.strategy dcp"):
        Scenario("s", world_size=2, batch_size=4, save=SaveConfig(strategy="sync"))
    with pytest.raises(ValueError, match="batch_size 3 must be divisible by world_size 2"):
        Scenario("s", world_size=2, batch_size=3)
    assert Scenario("s").world_size == 1


def test_the_distributed_suite_runs_fsdp_and_tensor_parallel_ranks_with_dcp_saves() -> None:
    suite = load_suite("distributed")
    assert len(suite.scenarios) >= 6
    assert all(s.save.strategy == "dcp" for s in suite.scenarios if not s.compile.enabled)  # compiled ranks: no saves
    stages = {s.name: s.parallel_layout.describe() for s in suite.scenarios if s.layout.pp > 1}
    assert stages == {"pp2-1f1b-full-dcp-sync": "dp_shard 1 x tp 1 x pp 2",  # pp alone, torchtitan's 3D, compiled
                      "dp2xtp2xpp2-selective-dcp-sync": "dp_shard 2 x tp 2 x pp 2", "pp2-full-compiled": "dp_shard 1 x tp 1 x pp 2",
                      "pp2xtp2-full-compiled-outside": "dp_shard 1 x tp 2 x pp 2",  # (and tp inside compiled stages)
                      "pp2xhsdp2-full-dcp-sync": "dp_replicate 2 x dp_shard 1 x tp 1 x pp 2",  # HSDP inside stages
                      "pp2xcp2-full-dcp-sync": "dp_shard 1 x tp 1 x pp 2 x cp 2",  # and cp inside stages
                      "pp2xcp2-full-compiled": "dp_shard 1 x tp 1 x pp 2 x cp 2"}  # (compiled too)
    assert any(s.save.async_save for s in suite.scenarios)
    fsdp = [s for s in suite.scenarios if not s.layout.tensor_parallel and s.layout.cp == 1 and s.layout.dp_replicate == 1]
    assert {s.name: s.parallel_layout.describe() for s in suite.scenarios if s.layout.dp_replicate > 1} == {
        "hsdp2x2-full-dcp-sync": "dp_replicate 2 x dp_shard 2 x tp 1",
        "pp2xhsdp2-full-dcp-sync": "dp_replicate 2 x dp_shard 1 x tp 1 x pp 2",
        "hsdp2xcp2-selective-dcp-sync": "dp_replicate 2 x dp_shard 1 x tp 1 x cp 2"}
    assert len(fsdp) >= 3 and all(s.world_size == 2 for s in fsdp)
    contexts = {s.name: s.parallel_layout.describe() for s in suite.scenarios if s.layout.cp > 1}
    assert contexts == {"cp2-none-dcp-sync": "dp_shard 1 x tp 1 x cp 2", "cp2-full-dcp-sync": "dp_shard 1 x tp 1 x cp 2",
                        "dp2xcp2-selective-dcp-async": "dp_shard 2 x tp 1 x cp 2",  # cp alone and with FSDP
                        "hsdp2xcp2-selective-dcp-sync": "dp_replicate 2 x dp_shard 1 x tp 1 x cp 2",  # and HSDP
                        "cp2-full-compiled": "dp_shard 1 x tp 1 x cp 2",  # and compiled
                        "pp2xcp2-full-dcp-sync": "dp_shard 1 x tp 1 x pp 2 x cp 2",  # and inside stages
                        "pp2xcp2-full-compiled": "dp_shard 1 x tp 1 x pp 2 x cp 2"}  # (compiled too)
    layouts = {s.layout.ranks(s.world_size) for s in suite.scenarios if s.layout.tensor_parallel and s.layout.pp == 1}
    assert layouts == {(1, 2), (2, 2)}  # tp 2 alone and torchtitan's 2D, as issue 32 item 1 asks
