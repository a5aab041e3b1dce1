"""benchmarks/gpu_margin.py measures on a GPU; what it computes from the measurements runs here: the margins, the
allocator counters read through a fake ``torch.cuda`` (``cuda_fakes``: allocated vs reserved as the caching
allocator keeps them), the snapshot record, the report and its summary line, the refusal without CUDA and the
skipped FSDP row on one GPU. One tiny row runs for real where a GPU is present (``gpu`` marker)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch

from cuda_fakes import FakeTorchCuda

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_margin", ROOT / "benchmarks" / "gpu_margin.py")
gpu_margin = importlib.util.module_from_spec(_spec)
sys.modules["gpu_margin"] = gpu_margin
_spec.loader.exec_module(gpu_margin)
GIB = 2**30
MIB = 2**20


class FakeCudaWithInfo(FakeTorchCuda):
    """The fake plus ``mem_get_info``: the device's free and total bytes, as NVML's used sees the device."""

    total = 141 * GIB

    def mem_get_info(self, device=None):
        return self.total - self._dev(device).nvml_used, self.total


def row(simulated=100 * MIB, allocated=110 * MIB, reserved=150 * MIB, outside=20 * MIB, total=1000 * MIB, **kw):
    fields = dict(family="gpt", card="gpt3-125m", strategy="none", batch_size=4, seq_len=2048, simulated_bytes=simulated,
                  max_allocated_bytes=allocated, max_reserved_bytes=reserved, outside_allocator_bytes=outside,
                  device_total_bytes=total, command="python benchmarks/gpu_margin.py --out x")
    return gpu_margin.MarginRow(**{**fields, **kw})


def test_margins_are_ratios_to_the_simulated_peak_and_a_fraction_of_the_device():
    r = row()
    assert r.allocated_margin == pytest.approx(0.10)
    assert r.reserved_margin == pytest.approx(0.50)
    assert r.device_margin == pytest.approx((150 + 20 - 100) / 1000)


def test_counters_keep_the_warm_up_cache_reserved_and_count_the_context_outside():
    cuda = FakeCudaWithInfo()
    resident = cuda.alloc(40 * MIB)  # weights and AdamW state
    warm = cuda.alloc(300 * MIB)  # the warm-up step's activations, freed into the cache
    cuda.free(warm)

    def step():
        cuda.free(cuda.alloc(100 * MIB))

    peaks = gpu_margin.allocator_peaks(step, None, cuda=cuda)
    assert peaks["max_allocated_bytes"] == 140 * MIB
    assert peaks["max_reserved_bytes"] == 340 * MIB  # nothing emptied: the cached 300 MiB stay reserved
    assert peaks["start_reserved_bytes"] == 340 * MIB
    assert peaks["outside_allocator_bytes"] == cuda.devices[0].context_bytes
    assert peaks["device_total_bytes"] == 141 * GIB
    assert ("reset", 0) in cuda.calls and ("empty_cache", 0) not in cuda.calls
    del resident


def test_the_peak_is_reset_before_the_counted_step():
    cuda = FakeCudaWithInfo()
    cuda.free(cuda.alloc(500 * MIB))
    cuda.empty_cache()  # an earlier row's peak, its cache given back
    peaks = gpu_margin.allocator_peaks(lambda: cuda.free(cuda.alloc(10 * MIB)), None, cuda=cuda)
    assert (peaks["max_allocated_bytes"], peaks["max_reserved_bytes"]) == (10 * MIB, 10 * MIB)


def snapshot(requested: int, size: int, free: int, trace=()) -> dict:
    blocks = [{"size": size, "requested_size": requested, "state": "active_allocated"}, {"size": free, "state": "inactive"}]
    return {"segments": [{"device": 0, "total_size": size + free, "allocated_size": size, "blocks": blocks}],
            "device_traces": [list(trace)]}


def test_snapshot_record_sets_the_counter_beside_the_replayed_peak():
    start = snapshot(1000, 1024, 2 * MIB - 1024)
    end = snapshot(1000, 1024, 2 * MIB - 1024, [{"action": "alloc", "addr": 1, "size": 700},
                                                {"action": "free_requested", "addr": 1, "size": 700}])
    record = gpu_margin.snapshot_record(start, end, 0, max_allocated_bytes=1024 + 1024)
    assert record["trace"]["peak_requested_bytes"] == 1700
    assert record["rounding_bytes"] == 2048 - 1700
    assert record["end"]["largest_free_block_bytes"] == 2 * MIB - 1024
    assert record["trace_truncated"] is False
    assert gpu_margin.snapshot_record(start, end, 0, 2048, max_entries=2)["trace_truncated"] is True


def test_report_has_every_rows_figures_the_command_and_the_skipped_reason(tmp_path):
    rows = [row(), row(card="llama3.2-1b", family="llama", strategy="full", simulated=200 * MIB, reserved=210 * MIB)]
    skipped = [gpu_margin.SkippedRow("FSDP 2 ranks, gpt3-125m none", "skipped: 1 GPU (one rank per GPU)")]
    path = gpu_margin.write_outputs(tmp_path, rows, skipped, {"device": "Fake H200", "torch": "2.13"}, "python x --out y")
    text = path.read_text()
    for r in rows:
        assert gpu_margin.main_table_row(r) in text
        assert gpu_margin.gib(r.simulated_bytes) in text and gpu_margin.pct(r.reserved_margin) in text
    assert "skipped: 1 GPU" in text and "`python x --out y`" in text and "Fake H200" in text
    tables = [line for line in text.splitlines() if line.startswith("|")]
    main = [line for line in tables if line.count("|") == gpu_margin.MAIN_HEADER.count("|")]
    assert len(main) == 1 + 1 + len(rows) + len(skipped)  # header, rule, rows, skipped
    assert text.rstrip().splitlines()[-1] == gpu_margin.summary_line(rows, skipped)
    assert (tmp_path / "gpu-margin.json").exists()


def test_summary_line_gives_the_range_of_reserved_over_simulated():
    line = gpu_margin.summary_line([row(reserved=150 * MIB), row(reserved=105 * MIB)], [])
    assert "from +5.0% to +50.0%" in line and "over 2 rows" in line
    assert "no row measured (1 skipped)" in gpu_margin.summary_line([], [gpu_margin.SkippedRow("a", "b")])


def test_rows_parse_and_a_malformed_item_is_named():
    assert gpu_margin.parse_rows("gpt3-125m:none, llama3.2-1b:full") == [("gpt3-125m", "none"), ("llama3.2-1b", "full")]
    with pytest.raises(ValueError, match="'gpt3-125m'"):
        gpu_margin.parse_rows("gpt3-125m")


def test_without_cuda_it_exits_naming_why(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exc:
        gpu_margin.main(["--out", str(tmp_path)])
    assert "sees no CUDA device" in str(exc.value.code)  # a message: exit status 1
    assert not (tmp_path / "gpu-margin.md").exists()


def test_on_one_gpu_the_fsdp_row_says_it_was_skipped_and_why(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    rows, skipped = gpu_margin.fsdp_rows(tmp_path, pickles=False, command="c")
    assert rows == [] and len(skipped) == 1
    assert skipped[0].reason.startswith("skipped: 1 GPU")


def test_with_two_gpus_each_rank_is_a_row_read_from_what_its_worker_wrote(monkeypatch, tmp_path):
    """The parent's launch arguments are what the torchrun worker unpacks, and the files it writes are the ones
    the parent reads (the launch and the GPU step are stand-ins; the contract between the two scripts is real)."""
    spec = importlib.util.spec_from_file_location("gpu_margin_rank", ROOT / "benchmarks" / "gpu_margin_rank.py")
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    from pytest_flashckpt.distributed import launcher

    measured = {"max_allocated_bytes": 110, "max_reserved_bytes": 150, "outside_allocator_bytes": 20,
                "device_total_bytes": 1000, "snapshot": {}}
    launched = []

    def fake_run(launch, script, args, log_path=None):
        launched.append((launch.nproc_per_node, Path(script).name))
        for rank in range(launch.nproc_per_node):
            monkeypatch.setattr(worker.dist, "get_rank", lambda: rank)
            worker.main(list(args))

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(launcher, "run", fake_run)
    monkeypatch.setattr(gpu_margin, "simulated_ranks", lambda card, strategy, batch, seq, world: [100, 101])
    monkeypatch.setattr(worker, "join_group", lambda: torch.device("cpu"))
    monkeypatch.setattr(worker.dist, "destroy_process_group", lambda: None)
    monkeypatch.setattr(worker, "build_trainer", lambda *a, **kw: (None, "sdpa"))
    monkeypatch.setattr(worker, "measure_trainer", lambda trainer, device, path: dict(measured))
    rows, skipped = gpu_margin.fsdp_rows(tmp_path, pickles=False, command="c")
    assert launched == [(2, "gpu_margin_rank.py")] and skipped == []
    assert [(r.rank, r.simulated_bytes, r.backend) for r in rows] == [("0/2", 100, "sdpa"), ("1/2", 101, "sdpa")]
    assert rows[1].reserved_margin == pytest.approx(150 / 101 - 1)


def test_the_default_rows_cover_a_gpt_and_a_llama_card():
    from pytest_flashckpt.models.cards import load_card

    families = {load_card(card).family for card, _ in gpu_margin.parse_rows(",".join(gpu_margin.DEFAULT_ROWS))}
    assert {"gpt", "llama"} <= families
    assert re.fullmatch(r"[\w.-]+:\w+", gpu_margin.FSDP_ROW)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; this machine has none")
def test_a_tiny_row_on_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_margin, "SEQ_LEN", 256)
    r = gpu_margin.one_process_row("tiny", "full", 2, tmp_path, pickles=True, command="test")
    snap = r.snapshot
    assert r.max_reserved_bytes >= r.max_allocated_bytes > 0
    assert not snap["trace_truncated"]
    assert 0 < snap["trace"]["peak_requested_bytes"] <= snap["max_allocated_bytes"]
    assert (tmp_path / "snapshots" / "tiny-full.pickle").stat().st_size > 0
