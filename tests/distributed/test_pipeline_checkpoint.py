"""A sharded checkpoint of pipeline stages (issue 32): the stages of every rank saved under the whole model's names
(``distributed.pipeline.PipelineTrainer.model``, the optimizer state flattened: ``sharded_store.SAVE_OPTIONS``)
load into fresh stages, into FSDP alone over every rank (1D) and into one process, bit for bit; an FSDP checkpoint
loads into the stages. pp 2 (world 2) and dp_shard 2 x pp 2 (world 4), one torchrun launch each (~15 s and ~25 s
on 2 cores), so ``slow``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("pipeline_checkpoint_worker.py")


@pytest.fixture(scope="module", params=[1, 2], ids=["pp2", "dp2xpp2"])
def launched(request, tmp_path_factory) -> tuple[Path, list[dict]]:
    from pytest_flashckpt.distributed import launcher

    dp = request.param
    out = tmp_path_factory.mktemp(f"ppck-{dp}")
    launcher.run(launcher.Launch(2 * dp, timeout_s=300), str(WORKER), [str(out), str(dp)], log_path=out / "launch.log")
    return out, [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2 * dp)]


@pytest.mark.distributed
@pytest.mark.slow
def test_a_checkpoint_of_the_stages_loads_bitwise_into_stages_1d_and_back(launched) -> None:
    _, ranks = launched
    for record in ranks:
        assert record["unloaded_differences"] > 0  # control: fresh stages of other weights differ before the load
        assert record["stages_differences"] == 0 and record["stages_step"] == record["step"] == 2
        assert record["one_d_differences"] == 0 and record["stage_keys_cover_1d"]
        assert record["from_1d_differences"] == 0


@pytest.mark.distributed
@pytest.mark.slow
def test_a_checkpoint_of_the_stages_loads_bitwise_into_one_process(launched) -> None:
    from safetensors.torch import load_file

    from pytest_flashckpt.distributed import fsdp, sharded_store

    from pipeline_worker import BATCH, SEED, SEQ, card

    out, _ = launched
    plain = fsdp.build_trainer(card(), batch_size=BATCH, seq_len=SEQ, seed=SEED + 5, distributed=False)[0]
    sharded_store.load_plain(plain, sharded_store.latest(out / "stages"))
    from pytest_flashckpt.checkpoint import dcp_io

    with dcp_io.process_group():
        loaded = sharded_store.local_full_state(plain)
    want = load_file(str(out / "ref.safetensors"))
    assert sorted(loaded) == sorted(want) and sharded_store.bitwise_differences(loaded, want) == []
    assert plain.step == 2
